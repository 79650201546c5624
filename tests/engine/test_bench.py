"""Benchmark records: fields that make sense, both runtimes, capture pairs, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import CancelledError, OptionsError
from engine.options import ExportOptions
from engine.pipeline import export
from engine.progress import CancelToken
from engine.runtime.bench import (
    BenchConfig,
    bench,
    bench_prompt,
    compare_capture,
    interleave,
    run_bench,
)
from tests._support.cli import cli

SMALL = BenchConfig(prompt_length=16, new_tokens=8, repeats=3, warmup=1)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "pkg"
    export(out, preset="gemma4-tiny", options=ExportOptions(ep="cpu", random_weights=True))
    return out


@pytest.mark.parametrize("runtime", ["ort", "genai"])
def test_bench_result_fields_are_sane(package: Path, runtime: str):
    seen: list[float] = []
    config = BenchConfig(runtime=runtime, prompt_length=16, new_tokens=8, repeats=3)  # type: ignore[arg-type]
    result, run = run_bench(package, config, progress=lambda f, m: seen.append(f))
    assert result.runtime == runtime and result.ep == "cpu"
    assert result.provider == "CPUExecutionProvider" and result.graph_capture is False
    assert (result.prompt_length, result.new_tokens, result.repeats) == (16, 8, 3)
    assert result.kv_mode == "shared"
    assert result.load_seconds > 0 and result.time_to_first_token_seconds > 0
    assert result.prefill_tokens_per_second > 0
    runs = result.decode_tokens_per_second_runs
    assert len(runs) == 3 and all(r > 0 for r in runs)
    assert result.decode_tokens_per_second_min <= result.decode_tokens_per_second
    assert result.decode_tokens_per_second <= result.decode_tokens_per_second_max
    assert result.peak_rss_bytes > 10 * 2**20
    assert len(result.tokens) == 8 and run.tokens == result.tokens
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    data = json.loads(json.dumps(result.to_json()))
    assert data["decode_tokens_per_second"] == result.decode_tokens_per_second
    if runtime == "ort":
        nodes = data["placement"]["nodes"]
        assert list(nodes) == ["CPUExecutionProvider"] and nodes["CPUExecutionProvider"] > 50
    else:
        assert any("placement" in note for note in data["notes"])


def test_keyword_entry_point_returns_one_record(package: Path):
    result = bench(package, runtime="genai", prompt_length=8, new_tokens=4, repeats=2, threads=1)
    assert (result.runtime, result.prompt_length, result.new_tokens) == ("genai", 8, 4)
    assert len(result.decode_tokens_per_second_runs) == 2
    ours = bench(package, prompt_length=8, new_tokens=4, repeats=2, threads=1)
    assert ours.tokens == result.tokens


def test_both_runtimes_generate_the_same_bench_tokens(package: Path):
    ours, _ = run_bench(package, SMALL)
    genai, _ = run_bench(package, BenchConfig(runtime="genai", prompt_length=16, new_tokens=8))
    assert ours.tokens == genai.tokens


def test_capture_pair_on_the_cpu_reports_why_capture_did_not_run(package: Path):
    comparison = compare_capture(package, SMALL)
    assert comparison.on is None and comparison.speedup is None and not comparison.validated
    assert "graph capture is not available for CPU" in (comparison.error or "")
    assert comparison.off.decode_tokens_per_second > 0
    assert json.loads(json.dumps(comparison.to_json()))["capture_validated"] is False


def test_interleaved_settings_each_get_a_record_or_an_error(package: Path):
    genai = BenchConfig(runtime="genai", prompt_length=16, new_tokens=8, repeats=2)
    ours = BenchConfig(prompt_length=16, new_tokens=8, repeats=2)
    seen: list[str] = []
    outcomes = interleave(
        package,
        [(ours, False), (ours, True), (genai, False)],
        progress=lambda f, m: seen.append(m),
    )
    assert [(o.runtime, o.graph_capture) for o in outcomes] == [
        ("ort", False),
        ("ort", True),
        ("genai", False),
    ]
    ok_ours, capture, ok_genai = outcomes
    assert capture.result is None and "graph capture is not available" in (capture.error or "")
    assert ok_ours.result is not None and ok_genai.result is not None
    assert ok_ours.error is None and ok_genai.error is None
    assert len(ok_ours.result.decode_tokens_per_second_runs) == 2
    assert ok_ours.result.peak_rss_scope == "process"
    assert ok_ours.result.tokens == ok_genai.result.tokens
    assert ok_ours.reference is not None and len(ok_ours.reference.logits) == 8
    assert "round 1/3" in seen and seen[-1] == "done"


def test_progress_counts_warm_up_and_timed_runs_each_on_their_own(package: Path):
    said: list[str] = []
    config = BenchConfig(prompt_length=4, new_tokens=2, repeats=2, warmup=1)
    run_bench(package, config, progress=lambda _, message: said.append(message))
    steps = [m for m in said if m.startswith(("run", "warm-up"))]
    assert steps == ["warm-up 1/1", "run 1/2", "run 2/2"]


def test_bench_prompt_is_seeded_and_in_range():
    a = bench_prompt(512, 64, seed=1)
    assert a == bench_prompt(512, 64, seed=1) != bench_prompt(512, 64, seed=2)
    assert len(a) == 64 and min(a) >= 4 and max(a) < 512


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"new_tokens": 1}, "--new-tokens must be between 2 and"),
        ({"repeats": 0}, "--repeats must be between 1 and"),
        ({"runtime": "tvm"}, "runtime must be ort or genai"),
    ],
)
def test_bad_bench_settings_are_refused(kwargs: dict, message: str):
    with pytest.raises(OptionsError, match=message):
        BenchConfig(**kwargs)


def test_cancel_stops_a_benchmark(package: Path):
    token = CancelToken()

    def cancel_after_loading(fraction: float, message: str) -> None:
        if fraction > 0:
            token.cancel()

    with pytest.raises(CancelledError):
        run_bench(package, SMALL, progress=cancel_after_loading, cancel=token)


def test_an_isolated_benchmark_runs_in_a_process_of_its_own_and_says_each_step(package: Path):
    """What the CLI and the studio run: the same tokens as in this process, the peak RSS
    the run's own, every step reported, "loading" first while the process starts."""
    import multiprocessing

    steps: list[str] = []
    children: list[int] = []

    def progress(fraction: float, message: str) -> None:
        steps.append(message)
        children.append(len(multiprocessing.active_children()))

    here, _ = run_bench(package, SMALL)
    there, generation = run_bench(package, SMALL, isolated=True, progress=progress)
    assert children[1:] and min(children[1:]) == 1  # every step after "loading": from the child
    assert there.tokens == here.tokens == generation.tokens
    assert there.peak_rss_scope == "benchmark"
    assert steps[0] == "loading (ort)" and steps[-1] == "done"
    assert [s for s in steps if s.startswith(("warm-up", "run"))] == [
        "warm-up 1/1", "run 1/3", "run 2/3", "run 3/3"
    ]  # fmt: skip


def test_cancelled_benchmark_releases_its_session(package: Path, monkeypatch):
    """A cancel must not keep the runner (and its device buffers) alive through the
    exception's traceback."""
    import weakref

    from engine.runtime import bench as bench_module

    created: list[weakref.ref] = []
    original = bench_module.BenchSession.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(weakref.ref(self.runner))

    monkeypatch.setattr(bench_module.BenchSession, "__init__", tracking_init)
    token = CancelToken()
    try:
        run_bench(package, SMALL, progress=lambda f, m: f > 0 and token.cancel(), cancel=token)
    except CancelledError as exc:
        kept = exc  # the traceback stays referenced, as in the app's errored signal
    assert created and created[0]() is None
    del kept


def test_bench_cli_json(package: Path):
    result = cli("bench", str(package), "--prompt-len", "8", "--new-tokens", "4", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["runtime"] == "ort" and data["new_tokens"] == 4 and data["capture_check"] is None
    assert data["decode_tokens_per_second"] > 0 and data["provider"] == "CPUExecutionProvider"


def test_bench_cli_text_shows_a_table(package: Path):
    result = cli(
        "bench",
        str(package),
        "--prompt-len",
        "8",
        "--new-tokens",
        "4",
        "--quiet",
        "--runtime",
        "genai",
    )
    assert result.returncode == 0, result.stderr
    assert "decode tok/s" in result.stdout and "runtime  genai" in result.stdout


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--prompt", "hello world"), "--prompt is the text of a prompt with media"),
        (("--runtime", "genai", "--kv-mode", "growing"), "--kv-mode growing is our runner's"),
    ],
    ids=["prompt-without-media", "genai-kv-mode"],
)
def test_bench_flags_the_run_would_not_use_are_refused(package: Path, flags: tuple, said: str):
    """Before, both ran anyway: 128 random tokens timed in place of the prompt, and genai's
    shared KV reported under --kv-mode growing."""
    result = cli("bench", str(package), *flags, "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr and result.stdout == ""


def test_bench_cli_refuses_a_folder_that_is_not_a_package(tmp_path: Path):
    result = cli("bench", str(tmp_path))
    assert result.returncode == 2 and "is not a package" in result.stderr
    assert "Traceback" not in result.stderr


def test_capture_is_refused_for_a_package_built_for_another_ep(package: Path):
    """A CPU package run on WebGPU has host nodes and int64 inputs: captured, its tokens
    differ from the uncaptured run. ``auto`` runs it without capture; asking for capture
    says why not and what to do, before anything runs."""
    from engine.errors import render_message
    from engine.runtime.package import (
        CaptureObstacle,
        capture_obstacle,
        capture_problem,
        open_package,
    )

    opened = open_package(package)
    assert opened.ep == "cpu" and opened.share_buffer
    problem = render_message(opened.capture_problem("webgpu") or "")
    assert "built for CPU" in problem and "--ep webgpu" in problem
    assert capture_problem("cuda", True, "CUDA") is None  # the EP as the user spelled it
    assert capture_problem("webgpu", True, "webgpu") is None
    assert capture_problem("webgpu", True, None) is None
    assert "has no graph capture" in str(capture_problem("webgpu", True, "cpu"))
    # The export that would capture is its own field, so callers need not parse the text.
    obstacle = opened.capture_obstacle("webgpu")
    assert obstacle is not None and obstacle.rebuild is not None
    assert render_message(obstacle.rebuild) == "export it with --ep webgpu"
    assert str(obstacle) == opened.capture_problem("webgpu")
    assert capture_obstacle("webgpu", True, "cpu") == CaptureObstacle("CPU has no graph capture")
    assert capture_obstacle("webgpu", False).rebuild is None  # type: ignore[union-attr]
    result = cli("bench", str(package), "--ep", "webgpu", "--graph-capture", "both", "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().endswith(
        "--graph-capture both: the package was built for CPU, not for capture on WebGPU; "
        "export it with --ep webgpu, or use --graph-capture off"
    ), result.stderr
    assert "Traceback" not in result.stderr
    # On its own EP too: refused before the capture-off run, in one sentence.
    for mode in ("on", "both"):
        result = cli("bench", str(package), "--graph-capture", mode, "--quiet")
        assert result.returncode == 2, result.stdout + result.stderr
        assert not result.stdout
        assert result.stderr.strip().endswith(
            f"--graph-capture {mode}: CPU has no graph capture; use --graph-capture off"
        ), result.stderr


def test_an_ep_this_onnxruntime_lacks_names_the_ones_it_has(package: Path):
    """As --ep values (onnxruntime's own provider list has names --ep does not take)."""
    result = cli("bench", str(package), "--ep", "cuda", "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "the CUDA EP (CUDAExecutionProvider) is not available" in line
    assert "install onnxruntime-gpu" in line and "run on one it offers (cpu" in line
    assert line.endswith("with --ep")
    assert "ExecutionProvider," not in line  # no provider list


def test_genai_rows_say_the_provider_was_asked_for(package: Path):
    """onnxruntime-genai reports no node placement: the table does not claim where it ran."""
    args = ("--new-tokens", "2", "--repeats", "1", "--prompt-len", "8", "--quiet")
    result = cli("bench", str(package), "--runtime", "genai", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "asked for CPUExecutionProvider" in result.stdout
    assert "ran on" not in result.stdout.splitlines()[1]
    ours = cli("bench", str(package), *args)
    assert "ran on CPUExecutionProvider" in ours.stdout.splitlines()[1]


def test_the_capture_check_says_what_it_compared(tmp_path: Path):
    """``both`` shows the run without capture beside it; ``on`` alone checks its tokens
    against an untimed run without capture, and says so."""
    from engine.options import ExportOptions
    from engine.pipeline import export
    from tests._support.webgpu import require_webgpu

    require_webgpu()
    package = tmp_path / "wg"
    export(package, preset="gemma4-tiny", options=ExportOptions(ep="webgpu", random_weights=True))
    args = ("--new-tokens", "3", "--repeats", "1", "--prompt-len", "8", "--quiet")
    said = {}
    for mode in ("on", "both"):
        result = cli("bench", str(package), "--graph-capture", mode, *args)
        assert result.returncode == 0, result.stdout + result.stderr
        (said[mode],) = [line for line in result.stdout.splitlines() if "capture vs" in line]
    assert said["on"].startswith("capture vs an untimed run without it: same tokens")
    assert said["both"].startswith("capture vs no capture: same tokens")


@pytest.fixture(scope="module")
def webgpu_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests._support.webgpu import require_webgpu

    require_webgpu()
    out = tmp_path_factory.mktemp("bench-wg") / "pkg"
    export(out, preset="gemma4-tiny", options=ExportOptions(ep="webgpu", random_weights=True))
    return out


def test_a_cancel_after_the_capture_off_run_can_keep_it(webgpu_package: Path):
    token = CancelToken()

    def cancel_in_the_capture_run(fraction: float, message: str) -> None:
        if fraction > 0.5:
            token.cancel()

    config = BenchConfig(prompt_length=8, new_tokens=3, repeats=1, warmup=0)
    kept = compare_capture(
        webgpu_package,
        config,
        progress=cancel_in_the_capture_run,
        cancel=token,
        keep_on_cancel=True,
    )
    assert kept.cancelled and kept.on is None and kept.error == "cancelled"
    assert kept.off.decode_tokens_per_second > 0 and not kept.off.graph_capture
    assert json.loads(json.dumps(kept.to_json()))["cancelled"] is True
    token = CancelToken()
    with pytest.raises(CancelledError):  # without keep_on_cancel: raised, as before
        compare_capture(webgpu_package, config, progress=cancel_in_the_capture_run, cancel=token)


def _interrupted(*args: object, **kwargs: object) -> object:
    raise KeyboardInterrupt("SIGINT")  # what Ctrl-C raises in the CLI's main thread


@pytest.mark.parametrize("mode", ["both", "on"])
def test_ctrl_c_after_a_finished_run_prints_it_before_it_stops(
    webgpu_package: Path,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    """``both``: Ctrl-C during the capture run still prints the capture-off row (a user's
    minutes of measurement); ``on``: Ctrl-C during the untimed check prints the timed
    run. Then exit 130, as any Ctrl-C."""
    from engine import cli as cli_module
    from engine.runtime import bench as bench_module

    real = bench_module.run_bench

    def capture_run_interrupted(*args: object, **kwargs: object) -> object:
        if kwargs.get("graph_capture"):
            _interrupted()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    if mode == "both":
        monkeypatch.setattr(bench_module, "run_bench", capture_run_interrupted)
    else:
        monkeypatch.setattr(bench_module, "validate_capture", _interrupted)
    args = ["--graph-capture", mode, "--new-tokens", "3", "--repeats", "1", "--warmup", "0"]
    code = cli_module.main(["bench", str(webgpu_package), *args, "--prompt-len", "8", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 130, out + err
    assert err.strip().splitlines()[-1] == "cancelled: interrupted"
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("off ", "on "))]
    assert rows == (["off"] if mode == "both" else ["on"]), out
    what = "run" if mode == "both" else "check against a run without capture"
    assert f"capture {what} not done: cancelled" in out


def _software_plugin(monkeypatch: pytest.MonkeyPatch, cores: int = 2) -> None:
    """Every EP runs through a plugin on the software adapter, on ``cores`` CPU cores."""
    from engine.runtime import bench as bench_module
    from engine.runtime.plugins import PluginDevice

    device = PluginDevice("WebGpuExecutionProvider", "lib.so", "0.4.0", (), software=True)
    monkeypatch.setattr(bench_module, "ort_plugin", lambda provider: device)
    monkeypatch.setattr(bench_module, "_cores", lambda: cores)


def test_a_software_adapter_estimate_counts_every_run_and_every_load(
    package: Path, monkeypatch: pytest.MonkeyPatch
):
    """On lavapipe each session loads the package, each run reads the prompt in one pass
    and the weights once per new token after the first: warm-ups, timed runs and the
    capture check's runs each count; a GPU or a built-in EP gives no estimate."""
    from engine.runtime import bench as bench_module
    from engine.runtime.bench import BenchConfig, software_adapter_seconds, weight_reads
    from engine.runtime.package import open_package

    opened = open_package(package)
    config = BenchConfig(prompt_length=10, new_tokens=6, repeats=3, warmup=1)
    monkeypatch.setattr(bench_module, "ort_plugin", lambda provider: None)
    assert software_adapter_seconds(opened, config, "off") is None
    _software_plugin(monkeypatch, cores=4)
    reads = weight_reads(opened)
    # the float tiny package: its tied embedding is read whole by the LM head, the
    # per-layer table only gathered; everything is stored
    data = (package / "model.onnx.data").stat().st_size
    assert reads.quantized == 0 and 0 < reads.per_token < data <= reads.stored
    step = reads.unquantized / (bench_module.SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND * 4)
    per_run = step + 5 * step  # the prompt's pass (no quantized weights), 5 more tokens
    load = reads.stored / bench_module.SOFTWARE_LOAD_BYTES_PER_SECOND
    for capture, runs, loads in (("off", 4, 1), ("on", 6, 2), ("both", 10, 2)):
        adapter, seconds = software_adapter_seconds(opened, config, capture)  # type: ignore[misc]
        assert "software adapter" in adapter
        assert seconds == pytest.approx(runs * per_run + loads * load), capture
    # the studio checks no capture run against another (only "both" keeps logits)
    _, seconds = software_adapter_seconds(opened, config, "on", capture_check=False)  # type: ignore[misc]
    assert seconds == pytest.approx(4 * per_run + load)


def test_the_software_adapter_estimate_of_e2b_matches_what_lavapipe_took():
    """The model behind the estimate against what lavapipe took on a 2-core machine
    (December 7, whole commands, ~5 s of start-up each): E2B's INT4 package whose tables
    stay fp16 (its tied head a 0.81 GB fp16 MatMul) 117.5 s for one run of 16 + 8 tokens
    without warm-up and 160.1 s for a warm-up and a run of 64 + 4 (the first estimate said
    76 s and 7 minutes); with INT4 tables 66.0 s for the quick look."""
    from engine.runtime import bench as bench_module
    from engine.runtime.bench import BenchConfig, WeightReads

    fp16_tables = WeightReads(1_085_036_544, unquantized=806_070_366, stored=6_790_053_998)
    int4_tables = WeightReads(1_116_493_824, unquantized=202_090_614, stored=2_877_816_966)
    quick = BenchConfig(prompt_length=16, new_tokens=8, repeats=1, warmup=0)
    longer = BenchConfig(prompt_length=64, new_tokens=4, repeats=1, warmup=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_module, "_cores", lambda: 2)
        for reads, config, took in (
            (fp16_tables, quick, 117.5),
            (fp16_tables, longer, 160.1),
            (int4_tables, quick, 66.0),
        ):
            seconds = bench_module._seconds(reads, config, "off", True)
            assert seconds == pytest.approx(took - 5, rel=0.1), (reads, config)


def test_a_long_software_adapter_benchmark_is_announced_with_a_quick_look(
    package: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """A bare full-size bench on lavapipe took an hour: before it starts, the user reads how
    long, and the settings that take about a minute (a face may offer fewer settings)."""
    from engine.cli import main
    from engine.errors import render_message
    from engine.runtime import bench as bench_module
    from engine.runtime.bench import BenchConfig, slow_bench
    from engine.runtime.package import open_package

    _software_plugin(monkeypatch)
    opened = open_package(package)
    config = BenchConfig(prompt_length=128, new_tokens=64, repeats=3, warmup=1)
    assert slow_bench(opened, config, "both") is None  # a tiny decoder: seconds
    # The same benchmark of a decoder a thousand times this one's size, per second of lavapipe:
    monkeypatch.setattr(bench_module, "SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND", 3e5)
    monkeypatch.setattr(bench_module, "SOFTWARE_LOAD_BYTES_PER_SECOND", 3e5)
    warning = render_message(str(slow_bench(opened, config, "both") or ""))
    assert f"{package.name} runs through the WebGpuExecutionProvider plugin 0.4.0, " in warning
    assert "software adapter (lavapipe, no GPU) here, where each token reads its 1.4 MiB" in warning
    assert warning.endswith(
        "of weights: this benchmark's 10 runs of 128 + 64 tokens take roughly 27 minutes; for "
        "a quick look (about 27 s): --prompt-len 16 --new-tokens 8 --repeats 1 --warmup 0 "
        "--graph-capture off"
    ), warning
    # only the settings that differ from the chosen ones, among those the face offers
    off = render_message(str(slow_bench(opened, config, "off") or ""))
    assert off.endswith("--prompt-len 16 --new-tokens 8 --repeats 1 --warmup 0"), off
    # capture the user asked for is kept: the quick look checks it too
    kept = render_message(str(slow_bench(opened, config, "both", keep_capture=True) or ""))
    assert kept.endswith(
        "(about 2 minutes): --prompt-len 16 --new-tokens 8 --repeats 1 --warmup 0"
    ), kept
    studio = slow_bench(
        opened, config, "both", ("prompt_len", "new_tokens", "repeats", "graph_capture")
    )
    assert studio is not None and studio.quick and "{opt:warmup" not in studio.quick
    # Settings already about that quick: how long, and no advice to do what they do.
    quick = BenchConfig(prompt_length=20, new_tokens=8, repeats=1, warmup=0)
    monkeypatch.setattr(bench_module, "SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND", 5e4)
    already = slow_bench(opened, quick, "off")
    assert already is not None and already.quick is None  # nothing to suggest
    said = render_message(str(already))
    assert said.endswith("this benchmark's 1 run of 20 + 8 tokens takes roughly 2 minutes"), said
    # The CLI says it on stderr before the first run (here the CPU runs it in seconds).
    monkeypatch.setattr(bench_module, "SOFTWARE_FLOAT_BYTES_PER_CORE_SECOND", 1e4)
    code = main(
        ["bench", str(package), "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1",
         "--warmup", "0", "--graph-capture", "off", "--quiet", "--json"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0
    assert out.err.startswith(f"note: {package.name} runs through the ")
    record = json.loads(out.out)  # stdout stays JSON (the adapter a field of it, from the
    # run's own process: tests/engine/test_webgpu_plugin.py checks it on the real plugin)
    assert record["runtime"] == "ort" and record["repeats"] == 1
