"""torchvision and timm models for the zoo, with random weights (nothing downloaded),
returned as the libraries return them. **For a GPU machine whose image has both
libraries**: on the project's CPU machine PyPI's torchvision is a CUDA build whose
operators fail to load beside the CPU torch, and timm needs torchvision.
``examples/zoo_vision.toml`` configures them.
"""

from __future__ import annotations


def _torchvision(name: str, **kwargs):
    import torchvision

    return torchvision.models.get_model(name, weights=None, **kwargs)


def _timm(name: str):
    import timm

    return timm.create_model(name, pretrained=False)


def tv_resnet18():
    return _torchvision("resnet18")


def tv_mobilenet_v3_small():
    return _torchvision("mobilenet_v3_small")


def tv_convnext_tiny():
    return _torchvision("convnext_tiny")


def tv_vit_b_16():
    return _torchvision("vit_b_16")


def tv_swin_t():
    return _torchvision("swin_t")


def timm_resnet18():
    return _timm("resnet18")


def timm_efficientnet_b0():
    return _timm("efficientnet_b0")


def timm_vit_tiny():
    return _timm("vit_tiny_patch16_224")


def timm_convnext_atto():
    return _timm("convnext_atto")
