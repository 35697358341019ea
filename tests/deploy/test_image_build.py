"""Motor's image (deploy/images/Dockerfile) built with Debian's buildah by ``scripts/build-images``
and run: every program's ``--help`` works in it as uid 10001, and its HEALTHCHECK command passes
against a gateway running in it (whose ``/ready`` is 503: no coordinator).

No image registry is reachable here, so the base is a Debian bookworm root filesystem with python3
made by mmdebstrap (the script's header says why); everything after FROM is the Dockerfile as
shipped. ``MOTOR_SKIP_IMAGE_BUILD=1`` skips this (several minutes) locally; CI runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT
from tests.helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

IMAGE = "localhost/motor:ci"
B = ["buildah", "--storage-driver", "vfs"]
PROGRAMS = ["motor-controller", "motor-coordinator", "motor-gateway", "motor-nodemanager", "motor-sim", "motor"]


def sh(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def container() -> Iterator[str]:
    if os.environ.get("MOTOR_SKIP_IMAGE_BUILD") == "1":
        pytest.skip("MOTOR_SKIP_IMAGE_BUILD=1")
    built = sh(str(ROOT / "scripts" / "build-images"), "--tag", "ci", timeout=1500)
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.split() == [IMAGE]
    made = sh(*B, "from", "-q", IMAGE)
    assert made.returncode == 0, made.stderr
    ctr = made.stdout.strip()
    try:
        yield ctr
    finally:
        sh(*B, "rm", ctr)


def run_in(ctr: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return sh(*B, "run", "--isolation", "chroot", ctr, "--", *argv, timeout=timeout)


def test_every_program_runs_in_the_image_as_a_non_root_user(container: str) -> None:
    for prog in PROGRAMS:
        out = run_in(container, prog, "--help")
        assert out.returncode == 0, f"{prog}: {out.stderr}"
        assert out.stdout.startswith(f"usage: {prog}"), out.stdout[:200]
    ident = run_in(container, "id", "-u")
    assert ident.stdout.strip() == "10001"
    extras = run_in(container, "python", "-c", "import aetcd, kubernetes, motor_controller.node_restarter, "
                    "motor_common.tracing as t; assert t.otel_available()")
    assert extras.returncode == 0, extras.stderr  # the ha, k8s and otel extras are in


def test_the_image_config_has_its_user_and_healthcheck(container: str) -> None:
    out = sh(*B, "inspect", "--type", "image", IMAGE)
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)["Docker"]["config"]
    assert cfg["User"] == "10001:10001"
    assert cfg["Healthcheck"]["Test"][:2] == ["CMD", "python"]
    assert "MOTOR_HEALTHCHECK_URL=http://127.0.0.1:8000/health" in cfg["Env"]


def test_the_healthcheck_passes_against_a_gateway_running_in_the_image(container: str) -> None:
    port = free_port()
    script = f"""
motor-gateway --port {port} --log-format text > /tmp/gateway.log 2>&1 &
pid=$!
python - <<'EOF'
import time, urllib.error, urllib.request
deadline = time.monotonic() + 30
while True:  # wait for the gateway to listen (bounded)
    try:
        urllib.request.urlopen("http://127.0.0.1:{port}/health", timeout=1)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
try:
    urllib.request.urlopen("http://127.0.0.1:{port}/ready", timeout=3)
except urllib.error.HTTPError as exc:
    print("ready", exc.code)
EOF
MOTOR_HEALTHCHECK_URL=http://127.0.0.1:{port}/health python -c "$HC" && echo healthcheck ok
kill $pid; wait $pid; echo "gateway exit $?"
"""
    hc = "import os, urllib.request; urllib.request.urlopen(os.environ['MOTOR_HEALTHCHECK_URL'], timeout=2)"
    out = sh(*B, "run", "--isolation", "chroot", "--env", f"HC={hc}", container, "--", "sh", "-c", script, timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["ready 503", "healthcheck ok", "gateway exit 0"], out.stdout + out.stderr
