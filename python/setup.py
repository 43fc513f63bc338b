"""Builds brain-sdk, generating its gRPC stubs from the repository's proto/ at build time.

The job master's API is `proto/proto/brain/jobmaster/v1/jobmaster.proto`; its Python stubs are
produced here by grpcio-tools (pinned in pyproject.toml's build requirements), never written by
hand or checked in. The .proto is compiled as `brain_sdk/_gen/jobmaster.proto` so the generated
modules import each other inside this package; the wire names (package brain.jobmaster.v1) are
those of the file.
"""

import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO = HERE.parent / "proto" / "proto" / "brain" / "jobmaster" / "v1" / "jobmaster.proto"


def generate(out: Path) -> None:
    if not PROTO.is_file():
        raise SystemExit(
            f"brain-sdk: {PROTO} not found: build the SDK from a checkout of the Brain "
            "repository (pip install ./python from its root)"
        )
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "brain_sdk" / "_gen"
        dest.mkdir(parents=True)
        shutil.copyfile(PROTO, dest / "jobmaster.proto")
        out.mkdir(parents=True, exist_ok=True)
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                "brain_sdk/_gen/jobmaster.proto",
            ]
        )
        if code != 0:
            raise SystemExit(f"brain-sdk: protoc failed on {PROTO} (exit {code})")


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate(Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithStubs})
