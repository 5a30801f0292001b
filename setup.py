"""The optional C extension ``sequencer._native`` (everything else is in pyproject.toml).

If it cannot be built (no compiler, no Python headers), the install still succeeds:
cdc-agent then runs its pure-Python sequencer and says so once when an agent starts.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on when the extension does not compile."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skipped(exc)

    @staticmethod
    def _skipped(exc: Exception) -> None:
        print(f"cdc-agent: the C extension was not built ({exc}); the pure-Python "
              "sequencer will be used", file=sys.stderr)


setup(
    ext_modules=[Extension("sequencer._native", ["sequencer/_native.c"],
                           extra_compile_args=["-O3", "-std=c11"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
