"""Build configuration beyond setup.cfg: the optional C part of the frame path.

threadloader.images._native reads a file and decodes its JPEG with the GIL released
once (threadloader/images/_native.c). It is optional: where it does not build (no
compiler, another platform) the install goes on and the pure-Python path runs.
"""

import sys

from setuptools import Extension, setup

native = Extension(
    "threadloader.images._native",
    sources=["threadloader/images/_native.c"],
    libraries=(["dl", "m"] if sys.platform.startswith("linux") else []),
    extra_compile_args=["-O3"],
    optional=True,
)

setup(ext_modules=[] if sys.platform == "win32" else [native])
