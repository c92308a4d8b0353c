"""Many workers behind one LiteLLM proxy (README "A shared LLM gateway"): a shared rate limit, a budget that stops
the run cleanly and resumes, a shared response cache, and run tags in the proxy's spend logs.

The proxy (``tests/support/gateway.py``) runs from ``.gateway`` in front of the scripted upstream ``FakeOpenAIServer``; the
workers are real ``chateval evaluate`` processes.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from gateway import OFFLINE_ENV, Gateway, ensure_proxy
from local_http import free_port
from readme_section import MANY_MACHINES, subsection_blocks
from repo_paths import ROOT

from chateval_dspy.testing.fake_lm import default_responder
from chateval_dspy.testing.fake_server import FakeOpenAIServer

pytestmark = pytest.mark.slow  # a real LiteLLM proxy on loopback

EXAMPLE = ROOT / "data" / "examples" / "gateway.yaml"
UPSTREAM_MODEL = "Qwen/Qwen2.5-7B-Instruct"  # the example config's upstream model id
BIN = Path(sys.executable).parent
# The proxy's callback: each request's tags, cost and outcome, one JSON line each (``GATEWAY_RECORD``).
RECORDER = '''
import json, os
from litellm.integrations.custom_logger import CustomLogger

class Recorder(CustomLogger):
    def _write(self, kwargs, ok):
        p = kwargs.get("standard_logging_object") or {}
        line = {"ok": ok, "tags": p.get("request_tags") or [], "cost": p.get("response_cost"), "cache_hit": p.get("cache_hit")}
        with open(os.environ["GATEWAY_RECORD"], "a") as f:
            f.write(json.dumps(line) + "\\n")

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, True)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._write(kwargs, False)

recorder = Recorder()
'''


class Upstream(FakeOpenAIServer):
    """The scripted upstream, with the UTC time of each chat request it answered (``stamps``)."""

    def __init__(self):
        self.stamps: list[dt.datetime] = []

        def responder(call):
            self.stamps.append(dt.datetime.now(dt.timezone.utc))
            return default_responder(call)

        super().__init__(responder=responder, model=UPSTREAM_MODEL)


def derived_config(tmp: Path, name: str, cache: bool = False, **params) -> Path:
    """The README's example config with ``litellm_params`` changed (None removes one) and the recorder; no cache, or
    with ``cache`` the example's own, its folder in ``tmp``."""
    config = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    deployment = config["model_list"][0]["litellm_params"]
    for key, value in params.items():
        deployment.pop(key, None) if value is None else deployment.__setitem__(key, value)
    settings = config["litellm_settings"] if cache else {"cache": False}
    if cache:
        settings["cache_params"]["disk_cache_dir"] = str(tmp / "gateway-cache")
    config["litellm_settings"] = {**settings, "callbacks": "recorder.recorder"}
    (tmp / "recorder.py").write_text(RECORDER, encoding="utf-8")
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def proxy_env(tmp: Path, upstream: str, key: str) -> dict[str, str]:
    return {"UPSTREAM_API_BASE": upstream, "UPSTREAM_API_KEY": "none", "LITELLM_MASTER_KEY": key,
            "GATEWAY_RECORD": str(tmp / "record.jsonl")}


def worker_env(tmp: Path, key: str, **extra) -> dict[str, str]:
    """A worker's environment: the proxy's key, ``chateval`` on PATH, MLflow in ``tmp``, no inherited run id."""
    env = {**os.environ, "CHATEVAL_API_KEY": key, "PATH": f"{BIN}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    env.pop("CHATEVAL_RUN_ID", None)
    return {**env, **extra}


def evaluate_cmd(url: str, split: str, out: Path, limit: int = 2, panel: tuple[str, ...] = ("--roles", "1", "--turns", "1")
                 ) -> list[str]:
    return [str(BIN / "chateval"), "evaluate", "--dataset", "faireval", "--split", split, "--limit", str(limit),
            *panel, "--model", url, "--served-model", "judge", "--no-cache", "--no-mlflow", "--no-progress",
            "--out", str(out)]


def items_of(path: Path) -> list[dict]:
    """The judged items of a results file (its header line left out)."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [x for x in lines if not x.get("header") and "id" in x]


def records(tmp: Path) -> list[dict]:
    path = tmp / "record.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def fill_window(url: str, key: str) -> int:
    """Send tiny requests until the proxy answers 429 (its rpm for this minute is spent); how many it let through."""
    body = json.dumps({"model": "judge", "messages": [{"role": "user", "content": "fill"}]}).encode()
    for sent in range(100):
        req = urllib.request.Request(url + "/chat/completions", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            urllib.request.urlopen(req, timeout=30).close()  # noqa: S310 - loopback
        except urllib.error.HTTPError as exc:
            assert exc.code == 429, exc.read()[:300]
            assert "retry-after" not in exc.headers and exc.headers["llm_provider-retry-after"] == "60"
            return sent
    raise AssertionError("the proxy never enforced its rpm")


RPM = 10


class RateScenario:
    """Two workers through a proxy with rpm 10, run on a thread from the module's start (its minute-long wait
    overlaps the other tests; ``test_two_workers_share_one_rate_limit_and_tag_their_requests`` reads it at the end).

    The proxy's minute is spent first (at most 15 s into a UTC minute, so that the workers' first calls fall in it),
    so their first calls get 429 with the proxy's renamed Retry-After (60 s).
    """

    def __init__(self, tmp: Path):
        self.tmp, self.key = tmp, "sk-" + secrets.token_hex(32)
        self.upstream = Upstream()
        self.workers: list[subprocess.Popen] = []
        self.outs: list[str] = []
        self.passed, self.took, self.started_s, self.error = 0, 0.0, None, None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rate-scenario", daemon=True)

    def _run(self) -> None:
        try:
            config = derived_config(self.tmp, "rpm", rpm=RPM, tpm=None, max_budget=None, budget_duration=None)
            with self.upstream as upstream_url, Gateway(config, proxy_env(self.tmp, upstream_url, self.key)) as gateway:
                url, self.started_s = gateway.url, gateway.started_s
                second = dt.datetime.now(dt.timezone.utc).second
                if self.stop.is_set() or second > 15 and self.stop.wait(60.5 - second):
                    return
                self.passed = fill_window(url, self.key)
                t0 = time.monotonic()
                for split, run in (("train", {"CHATEVAL_RUN_ID": "sweep-a"}), ("test", {})):
                    self.workers.append(subprocess.Popen(
                        evaluate_cmd(url, split, self.tmp / f"{split}.jsonl"), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, env=worker_env(self.tmp, self.key, **run)))
                self.outs = [p.communicate(timeout=240)[0] for p in self.workers]
                self.took = time.monotonic() - t0
        except BaseException as exc:  # handed to the test
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def rate_scenario(tmp_path_factory):
    """The ``RateScenario``, started by the first proxy test that names it, read by the last."""
    ensure_proxy()  # built here, not on the thread: the README's commands run .gateway/bin/litellm themselves
    scenario = RateScenario(tmp_path_factory.mktemp("rate"))
    scenario.thread.start()
    yield scenario
    scenario.close()


@pytest.mark.usefixtures("rate_scenario")  # started first: its minute-long wait overlaps this test and the next
def test_a_spent_budget_stops_the_run_cleanly_and_a_rerun_resumes_without_repaying(tmp_path):
    """The proxy's budget is spent mid-run: the worker stops at once (no retries) with one line naming the gateway
    and the budget, exit status 2, finished items kept. With the budget raised (the proxy restarted on the same
    port: the URL is part of the run's identity) the same command finishes, asking upstream only for the rest."""
    key, port, n = "sk-" + secrets.token_hex(32), free_port(), 4
    upstream = Upstream()
    out = tmp_path / "run.jsonl"
    with upstream as upstream_url:
        env = proxy_env(tmp_path, upstream_url, key)
        tight = derived_config(tmp_path, "tight", rpm=None, tpm=None, max_budget=0.0004, budget_duration="1d")
        with Gateway(tight, env, port=port) as gateway:
            url = gateway.url
            first = subprocess.run(evaluate_cmd(url, "train", out, limit=n) + ["--concurrency", "1"], capture_output=True,
                                   text=True, env=worker_env(tmp_path, key), timeout=120)
        paid = len(upstream.requests)
        kept = items_of(out)
        assert first.returncode == 2, first.stderr[-2000:]
        line = [x for x in first.stderr.splitlines() if x.startswith("chateval: error:")]
        assert len(line) == 1 and f"the gateway at {url}" in line[0] and "budget is spent" in line[0], first.stderr[-2000:]
        assert 0 < len(kept) < n and not any(x.get("abstentions") for x in kept), kept
        refused = [r for r in records(tmp_path) if not r["ok"]]
        # Not retried: the refusal of the item's first call (and of its other answer order, in flight) stopped it.
        assert 1 <= len(refused) <= 2, refused
        roomy = derived_config(tmp_path, "roomy", rpm=None, tpm=None, max_budget=1000, budget_duration="1d")
        with Gateway(roomy, env, port=port):
            second = subprocess.run(evaluate_cmd(url, "train", out, limit=n) + ["--concurrency", "1"],
                                    capture_output=True, text=True, env=worker_env(tmp_path, key), timeout=120)
    assert second.returncode == 0, second.stderr[-2000:]
    judged = items_of(out)
    assert len(judged) == n and len({x["id"] for x in judged}) == n
    assert [x["id"] for x in judged[:len(kept)]] == [x["id"] for x in kept]
    assert len(upstream.requests) - paid == 2 * (n - len(kept)), (paid, len(upstream.requests), len(kept))


def readme_script(upstream: str, port: int) -> str:
    """The README's three command blocks as one script, with loopback addresses: the upstream's host:port for
    ``vllm-host:8000``, ``127.0.0.1`` for ``gateway-host`` and ``0.0.0.0``, a free port for 4000, 2 items a worker,
    and ``disown -a`` between the gateway host's block and the workers'."""
    gateway, *workers = (c for lang, c in subsection_blocks(MANY_MACHINES, "A shared LLM gateway") if lang == "bash")
    # One shell plays both hosts: the workers' ``wait`` must not wait for the gateway host's proxy as well.
    code = "\n".join([gateway, "disown -a", *workers])
    for old, new in (("vllm-host:8000", upstream.split("//")[1].split("/")[0]), ("gateway-host", "127.0.0.1"),
                     ("0.0.0.0", "127.0.0.1"), (":4000", f":{port}"), ("--port 4000", f"--port {port}"),
                     ("--limit 50", "--limit 2")):
        assert old in code, old
        code = code.replace(old, new)
    return code


@pytest.mark.usefixtures("rate_scenario")
def test_the_readme_commands_share_one_gateway_and_its_cache(tmp_path):
    """The README's config and commands as written (``data/examples/gateway.yaml``): two workers on disjoint
    splits through one proxy, then a third worker repeating the first's items, answered by the proxy's cache."""
    import shutil

    (tmp_path / "data" / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, tmp_path / "data" / "examples" / "gateway.yaml")
    (tmp_path / ".gateway").symlink_to(ROOT / ".gateway")
    port, upstream = free_port(), Upstream()
    with upstream as upstream_url:
        script = readme_script(upstream_url, port)
        env = {**worker_env(tmp_path, ""), **OFFLINE_ENV}
        env.pop("CHATEVAL_API_KEY")
        t0 = time.monotonic()
        shell = subprocess.Popen(["bash", "-ec", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output = shell.communicate(timeout=240)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):  # the proxy, started in the background, is in its group
                os.killpg(shell.pid, signal.SIGTERM)
        took = time.monotonic() - t0
    assert shell.returncode == 0, output[-3000:] + (tmp_path / "gateway.log").read_text()[-2000:]
    w1, w2, w3 = (items_of(tmp_path / f"w{i}.jsonl") for i in (1, 2, 3))
    assert len(w1) == len(w2) == len(w3) == 2 and {x["id"] for x in w1} == {x["id"] for x in w3}
    assert not {x["id"] for x in w1} & {x["id"] for x in w2}
    bodies = [json.dumps(r["body"], sort_keys=True) for r in upstream.requests]
    assert len(bodies) == len(set(bodies)), "a request reached the upstream twice: the proxy's cache missed"
    assert not any(x.get("abstentions") for x in w1 + w2 + w3)
    print(f"README commands (proxy start, 3 workers) took {took:.1f} s; upstream answered {len(bodies)} requests")


def test_the_cache_holds_runs_of_hundreds_of_calls(tmp_path):
    """Two workers of 32 items each (the default panel, 8 calls an item: 256 calls
    each) fill the example's cache with 512 answers, then a third worker repeating the first one's items is
    answered from it: the upstream sees no call more. LiteLLM's in-memory cache kept 200 and sent all 256 again."""
    key, upstream = "sk-" + secrets.token_hex(32), Upstream()
    with upstream as upstream_url:
        config = derived_config(tmp_path, "cached", cache=True, rpm=None, tpm=None, max_budget=None,
                                budget_duration=None)
        with Gateway(config, proxy_env(tmp_path, upstream_url, key)) as gateway:
            def worker(split: str, name: str) -> subprocess.Popen:
                return subprocess.Popen(evaluate_cmd(gateway.url, split, tmp_path / f"{name}.jsonl", limit=32, panel=()),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=worker_env(tmp_path, key))

            first = [worker("train", "w1"), worker("test", "w2")]
            outs = [p.communicate(timeout=600)[0] for p in first]
            assert [p.returncode for p in first] == [0, 0], [o[-2000:] for o in outs]
            paid = len(upstream.requests)
            again = worker("train", "w3")
            out = again.communicate(timeout=600)[0]
            assert again.returncode == 0, out[-2000:]
    assert paid == 512, paid  # every call of the first two workers, each once
    bodies = [json.dumps(r["body"], sort_keys=True) for r in upstream.requests]
    assert len(set(bodies)) == len(bodies)
    assert len(upstream.requests) == paid, f"the repeated run sent {len(upstream.requests) - paid} of 256 calls upstream"
    w1, w3 = items_of(tmp_path / "w1.jsonl"), items_of(tmp_path / "w3.jsonl")
    assert len(w3) == 32 and sorted(x["id"] for x in w3) == sorted(x["id"] for x in w1)
    assert not any(x.get("abstentions") for x in w1 + w3)
    hits = [r for r in records(tmp_path) if r["ok"] and r["cache_hit"]]
    assert len(hits) == 256, len(hits)


# The client's side of the proxy's answers, without a proxy: what its 429s and budget refusals say on the wire.

def _status_error(status: int, body: dict, headers: dict | None = None):
    import httpx
    import openai

    response = httpx.Response(status, json=body, headers=headers or {},
                              request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
    cls = openai.RateLimitError if status == 429 else openai.BadRequestError if status == 400 else openai.APIStatusError
    return cls(body["error"]["message"], response=response, body=body)


def test_the_proxys_renamed_retry_after_is_honoured():
    """The proxy's own rpm 429 carries only ``llm_provider-retry-after``; the standard header wins when both come."""
    from chateval_dspy.lm.engine import _translate

    limited = {"error": {"message": "litellm.RateLimitError: No deployments available", "type": "throttling_error"}}
    assert _translate(_status_error(429, limited, {"llm_provider-retry-after": "60"}), "u").retry_after == 60
    both = {"retry-after": "3", "llm_provider-retry-after": "60"}
    assert _translate(_status_error(429, limited, both), "u").retry_after == 3
    assert _translate(_status_error(429, limited), "u").retry_after is None


@pytest.mark.parametrize("status, error", [
    (429, {"message": "No deployments available - crossed budget: Exceeded budget for deployment model_name: judge",
           "type": "internal_server_error"}),  # the router's deployment budget (no database), as 1.108.7 answers
    (422, {"message": "Budget has been exceeded! Current cost: 2.1, Max budget: 2.0", "type": "budget_exceeded"}),
    (400, {"message": "ExceededTokenBudget: Current spend for token: 3; Max Budget for Token: 2",
           "type": "budget_exceeded"}),
])
def test_a_spent_budget_is_budget_exceeded_and_is_not_retried(status, error):
    from dspy import lm15

    from chateval_dspy.errors import BudgetExceeded, FatalLMError
    from chateval_dspy.lm.engine import OpenAICompatEngine

    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "judge", max_retries=2)
    calls = []

    def create(**kwargs):
        calls.append(kwargs)
        raise _status_error(status, {"error": error})

    engine.client.chat.completions.create = create
    request = lm15.Request(model="judge", messages=(lm15.Message.user("hi"),))
    with pytest.raises(BudgetExceeded, match=r"the gateway at http://127.0.0.1:9/v1 refused the call: its budget is spent"):
        engine.complete(request)
    assert len(calls) == 1  # no retry
    with pytest.raises(BudgetExceeded):  # the breaker is open: later calls fail before sending anything
        engine.complete(request)
    assert len(calls) == 1 and isinstance(engine.breaker.error(), FatalLMError)
    assert "\n" not in str(engine.breaker.error())


def test_an_ordinary_429_is_still_a_retried_rate_limit():
    from chateval_dspy.lm.engine import _transient, _translate

    error = _translate(_status_error(429, {"error": {"message": "Rate limit reached for requests"}}), "u")
    assert type(error).__name__ == "RateLimitError" and _transient(error)


def test_requests_carry_the_run_tags_in_one_header(monkeypatch):
    from dspy import lm15

    from chateval_dspy.lm import tags
    from chateval_dspy.lm.engine import OpenAICompatEngine

    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "judge")
    seen = []

    def create(**kwargs):
        seen.append(kwargs.get("extra_headers"))
        raise _status_error(400, {"error": {"message": "stop here"}})

    engine.client.chat.completions.create = create
    request = lm15.Request(model="judge", messages=(lm15.Message.user("hi"),))
    with pytest.raises(Exception, match="stop here"):
        engine.complete(request)
    monkeypatch.setenv("CHATEVAL_RUN_ID", "sweep 7,b")
    with tags.tagging("my task"), pytest.raises(Exception, match="stop here"):
        engine.complete(request)
    assert seen == [None, {"x-litellm-tags": "chateval,run:sweep_7_b,task:my_task"}]
    monkeypatch.delenv("CHATEVAL_RUN_ID")
    with tags.tagging() as outer, tags.tagging("faireval") as inner:
        assert re.fullmatch(r"run:[0-9a-f]{12}", outer[1]) and inner == (*outer, "task:faireval")
    assert tags.header() == {}


def test_two_workers_share_one_rate_limit_and_tag_their_requests(rate_scenario):
    """``RateScenario``: both workers get 429s, wait out the 60 s Retry-After and finish every item; the upstream
    never sees more than the limit in a minute. Each request is tagged chateval, run and task; the proxy's callback
    records the tags and each answer's cost."""
    rate_scenario.thread.join(timeout=300)
    assert rate_scenario.error is None, rate_scenario.error
    assert [w.returncode for w in rate_scenario.workers] == [0, 0], rate_scenario.outs
    assert 0 < rate_scenario.passed <= RPM
    for split in ("train", "test"):
        judged = items_of(rate_scenario.tmp / f"{split}.jsonl")
        assert len(judged) == 2 and len({x["id"] for x in judged}) == 2, judged
        assert not any(x.get("abstentions") for x in judged), judged
    per_minute = collections.Counter(s.strftime("%H:%M") for s in rate_scenario.upstream.stamps)
    assert max(per_minute.values()) <= RPM and len(per_minute) >= 2, per_minute
    assert rate_scenario.took >= 50, f"the workers did not wait out the 60 s Retry-After ({rate_scenario.took:.0f} s)"
    tagged = [r for r in records(rate_scenario.tmp) if "chateval" in r["tags"]]
    assert any(not r["ok"] for r in tagged), "no worker request was refused: the limit was not exercised"
    runs = {t for r in tagged for t in r["tags"] if t.startswith("run:")}
    assert "run:sweep-a" in runs and any(re.fullmatch(r"run:[0-9a-f]{12}", t) for t in runs), runs
    assert all("task:faireval" in r["tags"] for r in tagged)
    assert all(r["cost"] > 0 for r in tagged if r["ok"])
    print(f"proxy started in {rate_scenario.started_s:.1f} s; rate-limited workers finished in {rate_scenario.took:.1f} s; "
          f"upstream per minute {dict(per_minute)}")
