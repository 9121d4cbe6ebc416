"""Build hook for the C extensions; everything else is declared in pyproject.toml.

- ``localstate.changelog.file._framing`` frames and decodes file-changelog records (see
  changelog/file/format.py);
- ``localstate.engines.kv._hotpath``: the kv engine's get/put fast paths (see engines/kv/engine.py);
- ``localstate.core._sorting``: a bulk load's run sorted by key (see core/backend.py, sorted_items).

Both are optional: where one cannot be compiled (no C compiler, no Python or zlib headers) the install
still succeeds and the pure-Python code it replaces runs (``localstate.core.native``).
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
        ),
        Extension(
            "localstate.engines.kv._hotpath",
            sources=["engines/kv/_hotpath.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "localstate.core._sorting",
            sources=["core/_sorting.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
