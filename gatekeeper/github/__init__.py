"""gatekeeper on GitHub, one job per module (nothing is imported here):

* ``client``: the REST API through PyGithub (imported lazily): GITHUB_API_URL, rate limits, retries;
* ``comment``: the one sticky PR comment, upserted by marker and author, never duplicated;
* ``event``: the Actions event: the pull request, its base sha and labels, fork detection;
* ``actions``: step outputs, the job summary, annotations, log groups, masks;
* ``announce``: a gate report as outputs, summary and annotations.
"""
