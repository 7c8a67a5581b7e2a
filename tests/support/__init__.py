"""What the tests share: project builders and the ``gk`` runner (helpers, projects),
results factories, the store fixtures over both backends (stores), moto's S3 server
(s3_server), a local server that behaves like the GitHub REST API (github_server), and
headless Chromium (browser)."""
