"""Build hook for the one C extension; everything else is declared in pyproject.toml.

``localstate.changelog.file._framing`` frames and decodes file-changelog records in C (see
changelog/file/format.py). It is optional: where it cannot be compiled (no C compiler, no Python
headers, no zlib headers) the install still succeeds and the pure-Python framing is used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "localstate.changelog.file._framing",
            sources=["changelog/file/_framing.c"],
            libraries=["z"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
