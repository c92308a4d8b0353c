"""A wheel works for someone who installs the package instead of working in a checkout.

The wheel is built from this tree and installed into a fresh virtual environment that sees this environment's
dependencies but not the source tree (no editable install, a working directory outside the repository). From
there the installed ``chateval`` judges one item of each built-in dataset (the files read from the installed
package) against the scripted OpenAI-compatible server, compiles and saves a program, and ``chateval_dspy.load``
loads it.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from repo_paths import ROOT

from optim.tracking.models import SOURCES

pytestmark = pytest.mark.slow  # builds a wheel and installs it in a fresh environment


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy: a build in the checkout writes build/ there, which another test process may be building in.
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                            "-w", str(work / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    wheel = next((work / "dist").glob("chateval_dspy-*.whl"))
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("optim/bench/")]  # run from a checkout
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # The new environment borrows this one's dependencies; a .pth line adds the directory without running the
    # editable install's own .pth hooks, so chateval_dspy can only come from the wheel.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "borrowed-deps.pth").write_text("\n".join(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(CHATEVAL_CACHE_DIR=str(work / "cache"), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    cwd = work / "elsewhere"
    cwd.mkdir()
    server = subprocess.Popen([str(py), "-m", "chateval_dspy.testing"], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    yield venv, cwd, env, url
    server.kill()
    server.wait()


def run(venv, cwd, env, *argv, timeout=600):
    proc = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{argv}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_package_comes_from_the_wheel(installed):
    venv, cwd, env, _ = installed
    where = run(venv, cwd, env, "python", "-c", "import chateval_dspy, optim; print(chateval_dspy.__file__, optim.__file__)")
    assert str(ROOT) not in where and "site-packages" in where, where


@pytest.mark.parametrize("dataset", ["faireval", "topical_chat"])
def test_installed_cli_judges_a_builtin_dataset(installed, dataset):
    venv, cwd, env, url = installed
    out = run(venv, cwd, env, "chateval", "evaluate", "--dataset", dataset, "--limit", "1", "--model", url,
              "--roles", "1", "--turns", "1", "--no-mlflow", "--no-progress", "--out", f"{dataset}.jsonl")
    assert "items=1" in out and f"data={dataset}" in out, out
    assert len((cwd / f"{dataset}.jsonl").read_text().splitlines()) == 1


def test_installed_package_loads_a_saved_program(installed):
    venv, cwd, env, url = installed
    run(venv, cwd, env, "chateval", "compile", "--dataset", "faireval", "--optimizer", "labeled", "--limit", "2",
        "--roles", "1", "--turns", "1", "--model", url, "--no-mlflow", "--no-progress", "--out", "prog")
    code = ("import json, sys, chateval_dspy\n"
            f"with chateval_dspy.load('prog', lm=chateval_dspy.LMSpec(model={url!r})) as judge:\n"
            "    v = judge({'question': '2+2?', 'answer_1': '4', 'answer_2': '5'})\n"
            "print(json.dumps({'winner': v.winner, 'calls': v.calls}))\n")
    verdict = json.loads(run(venv, cwd, env, "python", "-c", code).strip().splitlines()[-1])
    assert verdict["winner"] in ("1", "2", "tie") and verdict["calls"] == 2
