"""Hostile input to plugin discovery and to the model commands: a plugin that exits, claims a
built-in device or its kernels, or returns the wrong thing; --output paths that hold something;
prompts that are not UTF-8; broken chat templates; out of memory and double frees on a simulated
chip. Each is refused with a clear reason, and nothing else breaks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from anychip import plugins
from anychip.devices import describe_all

# ---- plugins, discovered in-process beside the installed ones -----------------------------------


@pytest.fixture
def discover_with(tmp_path, monkeypatch):
    """discover() with the installed plugins plus third-party ones: {entry-point name: (module
    name, source)}; the registry it returns is also what describe_all() lists."""

    def discover(fakes: dict[str, tuple[str, str]]):
        for module, code in fakes.values():
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(code))
        monkeypatch.syspath_prepend(str(tmp_path))
        real = plugins.entry_points
        extra = [EntryPoint(name, module, plugins.ENTRY_POINT_GROUP) for name, (module, _) in fakes.items()]
        monkeypatch.setattr(plugins, "entry_points", lambda group: [*real(group=group), *extra])
        reg = plugins.discover()
        monkeypatch.setattr(plugins, "_registry", reg)
        return reg

    return discover


def cpu_kernels(reg) -> list:
    return sorted(((k.op, k.dtypes, repr(k.forward)) for k in reg.kernels.kernels() if k.device == "cpu"))


def reasons(reg, plugin: str) -> str:
    return "; ".join(p.reason for p in reg.problems if p.plugin == plugin)


def test_a_plugin_registering_kernels_for_cpu_is_disabled_and_cpu_stays_intact(discover_with):
    """Kernels for a dtype the cpu lacks used to be added to the cpu device (an error the plugin
    swallowed did not stop it)."""
    baseline = cpu_kernels(plugins.discover())
    reg = discover_with({"kerneltheft": ("hostile_kerneltheft", """
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.simulated_device("mine", anychip.ChipTraits(
                model="Mine", vendor="Test", memory_bytes=1 << 30, dtypes=("float32",)),
                description="a device of its own", paddle_type="anychip_mine")]
        @anychip.hookimpl
        def anychip_register_kernels(registry):
            registry.register("rms_norm", "mine", ("float32",), forward=lambda i, o, a: None)
            try:
                registry.register("rms_norm", "cpu", ("int8",), forward=lambda i, o, a: None)
            except Exception:
                pass
    """)})
    assert cpu_kernels(reg) == baseline
    assert reg.device_plugin["cpu"] == "cpu"
    assert "mine" not in reg.devices and reg.kernels.count("mine") == 0  # the whole plugin is off
    claim = "plugin 'kerneltheft' registers kernels for device 'cpu', which belongs to the built-in cpu plugin"
    assert reasons(reg, "kerneltheft") == claim
    (row,) = [i for i in describe_all() if i.name == "kerneltheft"]
    assert row.status == "unavailable" and claim in row.reason
    assert {i.name: i.status for i in describe_all()}["cpu"] == "hardware"


@pytest.mark.parametrize("marker, module", [
    ("@anychip.hookimpl(trylast=True)", "hostile_late_thief"),  # pluggy used to list it first
    ("@anychip.hookimpl", "anychip_plugins_lookalike"),  # its module name used to make it built-in
])
def test_a_built_in_device_name_is_refused_whatever_the_order(discover_with, marker, module):
    reg = discover_with({"aaa": (module, f"""
        import anychip
        {marker}
        def anychip_register_devices():
            return [anychip.DeviceSpec(name="cpu", description="not the cpu", library="/nonexistent.so"),
                    anychip.DeviceSpec(name="extra", description="its other device", library="/nonexistent.so")]
    """)})
    assert reg.device_plugin["cpu"] == "cpu" and reg.devices["cpu"].description != "not the cpu"
    assert "extra" not in reg.devices
    assert reasons(reg, "aaa") == "plugin 'aaa' registers device 'cpu', which belongs to the built-in cpu plugin"


def test_plugins_that_exit_or_raise_base_exceptions_are_listed(discover_with):
    """SystemExit in the codegen hook used to end discovery, and every command with it."""
    reg = discover_with({
        "exitgen": ("hostile_exitgen", """
            import anychip, sys
            @anychip.hookimpl
            def anychip_register_codegen_backends():
                sys.exit(3)
        """),
        "odd": ("hostile_odd", """
            class VendorAbort(BaseException):
                pass
            raise VendorAbort("licence check aborted")
        """),
    })
    assert "anychip_register_codegen_backends: SystemExit: 3" in reasons(reg, "exitgen")
    assert "import failed: VendorAbort: licence check aborted" in reasons(reg, "odd")
    assert {"cpu", "npu"} <= set(reg.devices)


def test_ctrl_c_while_a_plugin_imports_is_not_swallowed(discover_with):
    with pytest.raises(KeyboardInterrupt):
        discover_with({"interrupted": ("hostile_interrupted", "raise KeyboardInterrupt\n")})


@pytest.mark.parametrize("returned", ["anychip.DeviceSpec(name='solo', description='', library='x.so')", "None"])
def test_a_device_hook_returning_no_iterable_says_what_it_should_return(discover_with, returned):
    name = f"wrongtype{returned == 'None'}".lower()
    reg = discover_with({name: (f"hostile_{name}", f"""
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            return {returned}
    """)})
    assert "solo" not in reg.devices
    assert "expected a list (or other iterable) of anychip.DeviceSpec" in reasons(reg, name)


def test_an_ops_hook_returning_junk_or_raising_is_listed_and_anychips_ops_stay(discover_with):
    from anychip.ops import OPS

    reg = discover_with({
        "junkops": ("hostile_junkops", """
            import anychip
            @anychip.hookimpl
            def anychip_register_ops():
                return ["log1p"]
        """),
        "raiseops": ("hostile_raiseops", """
            import anychip
            @anychip.hookimpl
            def anychip_register_ops():
                raise RuntimeError("op table corrupt")
        """),
        "thiefops": ("hostile_thiefops", """
            import anychip
            from anychip.ops import OPS
            @anychip.hookimpl
            def anychip_register_ops():
                return [OPS["rms_norm"]]
        """),
    })
    assert "returned a str among its ops, expected anychip.ops.definition.OpDef" in reasons(reg, "junkops")
    assert "anychip_register_ops: RuntimeError: op table corrupt" in reasons(reg, "raiseops")
    assert "anychip_register_ops: op 'rms_norm' is already defined by anychip" in reasons(reg, "thiefops")
    assert reg.ops == {} and "rms_norm" in OPS
    assert {"cpu", "npu"} <= set(reg.devices)


# ---- the model commands ------------------------------------------------------------------------------


def anychip(*args, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; arguments may be bytes (argv that is not UTF-8). stderr as text."""
    proc = subprocess.run([sys.executable, "-m", "anychip.cli.main", *(a if isinstance(a, bytes) else str(a)
                                                                     for a in args)],
                          capture_output=True, input=stdin, timeout=300, env={**os.environ, **(env or {})})
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def clean_error(proc, code: int = 1) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    from training_helpers import sft_records, write_jsonl

    return write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", sft_records(4))


def finetune(model_dir, data_file, output, *extra):
    return anychip("finetune", "--model", model_dir, "--data", data_file, "--max-steps", "1", "--max-length", "48",
                   "--output", output, *extra)


def test_finetune_refuses_an_output_it_cannot_use(model_dir, data_file, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert f"--output {notes} is a file" in clean_error(finetune(model_dir, data_file, notes))
    assert notes.read_text() == "mine"
    err = clean_error(finetune(model_dir, data_file, notes / "run"))
    assert f"--output {notes / 'run'} cannot be created: {notes} is a file" in err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert f"{locked} is not writable" in clean_error(finetune(model_dir, data_file, locked / "run"))
    fresh = tmp_path / "fresh"
    err = clean_error(finetune(model_dir, data_file, fresh, "--resume"))  # used to start afresh silently
    assert f"--resume: {fresh} holds no complete checkpoint-<step> folder" in err and not fresh.exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert "--overwrite" in clean_error(finetune(model_dir, data_file, full))


def test_finetune_into_an_earlier_output_needs_resume_or_overwrite(model_dir, data_file, tmp_path):
    """A re-run used to end in a FileExistsError traceback."""
    out = tmp_path / "run"
    assert finetune(model_dir, data_file, out).returncode == 0
    err = clean_error(finetune(model_dir, data_file, out))
    assert f"--output {out} holds checkpoints of an earlier run" in err and "--resume" in err and "--overwrite" in err
    again = finetune(model_dir, data_file, out, "--overwrite")
    assert again.returncode == 0, again.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]  # the earlier run's log was replaced, not appended to
    assert "pass one" in clean_error(finetune(model_dir, data_file, out, "--overwrite", "--resume"))


def test_the_trainer_refuses_to_resume_without_a_checkpoint(base, tmp_path):
    from anychip_models.training.checkpoints import CheckpointStateError
    from anychip_models.training.data import ChatFormat, load_sft_data
    from anychip_models.training.model import TrainableModel
    from anychip_models.training.trainer import TrainArgs, Trainer
    from training_helpers import sft_records, write_jsonl

    examples, _ = load_sft_data(write_jsonl(tmp_path / "d.jsonl", sft_records(2)),
                                ChatFormat.from_tokenizer(base.tokenizer), 48)
    trainer = Trainer(TrainableModel(base, ("cpu", 0)), base, examples, [], TrainArgs(max_length=48, max_steps=1),
                      tmp_path / "out", progress=False)
    with pytest.raises(CheckpointStateError, match="no complete checkpoint-<step> folder to resume from"):
        trainer.train(resume=True)


@pytest.mark.parametrize("args, message", [
    ([b"\xff"], "PROMPT is not valid UTF-8 text (byte 0xff at character 0)"),
    (["fine", b"ab\xfe"], "PROMPT 2 is not valid UTF-8 text (byte 0xfe at character 2)"),
    (["--system", b"\xc3(", "hi"], "--system is not valid UTF-8 text (byte 0xc3 at character 0)"),
    (["--stop", b"\xff", "hi"], "--stop is not valid UTF-8 text"),
])
def test_generate_refuses_text_that_is_not_utf8(model_dir, args, message):
    """Used to end in a TypeError traceback from the tokenizer."""
    assert message in clean_error(anychip("generate", "--model", model_dir, "--max-new-tokens", "2", *args))


def test_chat_skips_an_input_line_that_is_not_utf8(model_dir):
    """With strict UTF-8 stdin, the line used to end the chat in a UnicodeDecodeError traceback."""
    proc = anychip("chat", "--model", model_dir, "--max-new-tokens", "2", stdin=b"hi\xff\nhello\n",
                   env={"PYTHONIOENCODING": "utf-8"})
    err = clean_error(proc, code=0)
    assert "input line 1 is not valid UTF-8 text (byte 0xff at character 2)" in err
    assert proc.stdout.strip()  # the second line was answered


@pytest.fixture
def templated(model_dir, tmp_path):
    """A copy of the tiny chat model whose chat_template.jinja is the given text."""

    def folder(template: str):
        copy = shutil.copytree(model_dir, tmp_path / "templated")
        (copy / "chat_template.jinja").write_text(template)
        return copy

    return folder


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}\n{{ m.content }}{% endfr %}", "line 2: syntax error: Encountered unknown tag 'endfr'"),
    ("x\n{{ raise_exception('the first turn must be a system turn') }}",
     "line 2: the first turn must be a system turn"),
    ("{{ messages[0].content }}\n\n{{ 1 // 0 }}", "line 3: ZeroDivisionError: integer division or modulo by zero"),
])
def test_chat_template_errors_name_the_template_and_line(templated, template, message):
    """Used to be raw Jinja tracebacks."""
    folder = templated(template)
    err = clean_error(anychip("generate", "--model", folder, "--max-new-tokens", "2", "hi"))
    assert f"the chat template {folder / 'chat_template.jinja'}: {message}" in err


def test_finetune_chat_template_file_errors_are_bad_records(model_dir, data_file, tmp_path):
    """A --chat-template whose expression raises (not a Jinja error) used to be a traceback."""
    template = tmp_path / "chat_template.json"
    template.write_text(json.dumps({"conversation": ["{{user}}{{ 1 // 0 }}", "{{bot}}"], "query": "{{query}}"}))
    err = clean_error(finetune(model_dir, data_file, tmp_path / "out", "--chat-template", template))
    assert f"{data_file}:1: {template}: rendering failed (line 1: ZeroDivisionError" in err


def test_out_of_memory_on_a_simulated_chip_is_one_clear_error(model_dir):
    """Used to end in Paddle's 'CustomDevice error, the error code is : 2' traceback."""
    err = clean_error(anychip("generate", "--device", "npu", "--model", model_dir, "--max-new-tokens", "2", "hi",
                              env={"ANYCHIP_SIM_CAPACITY": str(200 << 10)}))
    assert "anychip generate: error: npu:0 out of memory: requested " in err
    assert " of 204800 free" in err


def test_double_free_names_the_buffer():
    """Used to report 'free of (nil): not a pointer of this device'."""
    from anychip.runtime import InvalidArgumentError, open_device

    buf = open_device("npu:0").allocate(1024)
    address = buf.ptr
    buf.free()
    with pytest.raises(InvalidArgumentError, match=rf"npu:0: free of {address:#x} \(1024 bytes\): this buffer was "
                                                   "already freed"):
        buf.free()
