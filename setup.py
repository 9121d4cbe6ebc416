"""Build hook for the C extensions; everything else is declared in pyproject.toml.

All of them live in ``native/`` (the package ``localstate.native``, whose ``__init__`` is the one
loader):

- ``localstate.native._framing`` frames and decodes changelog records (see changelog/framing.py);
- ``localstate.native._hotpath``: the kv engine's get/put fast paths (see engines/kv/engine.py);
- ``localstate.native._sorting``: a bulk load's run sorted by key (see core/backend.py, sorted_items).

Each is optional: where one cannot be compiled (no C compiler, no Python or zlib headers) the install
still succeeds and the pure-Python code it replaces runs (``localstate.native.load``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "localstate.native._framing",
            sources=["native/_framing.c"],
            libraries=["z"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "localstate.native._hotpath",
            sources=["native/_hotpath.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "localstate.native._sorting",
            sources=["native/_sorting.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
