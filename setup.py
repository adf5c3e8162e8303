"""Packaging glue that pyproject.toml cannot express: resources/ travels in the wheel.

resources/ stays at the top of the repository (icon, sample photos); in a wheel it is installed as the
data package attn_explorer/_resources, which `attn_explorer.resources.resource_path` looks in.
"""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["attn_explorer", "attn_explorer.*"]) + ["attn_explorer._resources"],
    package_dir={"attn_explorer._resources": "resources"},
    package_data={"attn_explorer._resources": ["*.png", "samples/*", "models/*", "html/*",
                                           "corpus/*.txt", "corpus/README.md"]},  # corpus: the atlas (issue 27)
)
