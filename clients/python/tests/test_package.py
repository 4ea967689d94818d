"""The package builds as `pip install ./clients/python` builds it, and ships
the generated messages with their stubs and the typed markers."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def test_the_wheel_holds_the_client_and_the_typed_messages(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path), str(Path(__file__).parents[1])],
        check=True,
    )
    [wheel] = tmp_path.glob("mesh_provisioner_client-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("capture", "compose", "provisioning", "provisions", "registry", "state", "write"):
        assert f"mesh/provisioner/v1/{module}_pb2.py" in names
        assert f"mesh/provisioner/v1/{module}_pb2.pyi" in names
    assert {"mesh/provisioner/v1/py.typed", "mesh_provisioner/py.typed", "mesh_provisioner/client.py"} <= names
    assert not any(name.startswith("tests/") for name in names)
