"""allocator.config: the operator's YAML, every mistake named by file and dotted key."""

from pathlib import Path

import pytest

from allocator.host import config
from allocator.host.config import (
    Config,
    ConfigError,
    EngineConfig,
    PluginConfig,
    PolicyConfig,
    ShimConfig,
    load,
    parse,
    resolve_path,
)

CFG = "/etc/gpu-alloc/test.yaml"

FULL = """
engine: {socket: /run/docker-alt.sock, timeout: 3.5, daemon_json: /etc/docker/alt.json}
shim: {socket: /run/gpu-alloc/d.sock, mode: "0640", group: gpu, create_timeout: 30}
plugin: {socket: /run/docker/plugins/x.sock, workers: 4}
policy: {placement: first-fit, lock_timeout: 2, pending_ttl: 60.5}
state_dir: /srv/gpu-alloc
gpus: /etc/gpu-alloc/gpus.yaml
"""


def refusal(text: str, path: str = CFG) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, path)
    return str(info.value)


# --- what is accepted --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}", "engine:\nshim: {}\n"])
def test_an_empty_file_or_empty_sections_give_the_defaults(text: str) -> None:
    cfg = parse(text, CFG)
    assert cfg == Config(source=CFG)
    assert cfg.engine == EngineConfig(
        socket="/var/run/docker.sock", timeout=10.0, daemon_json="/etc/docker/daemon.json"
    )
    assert cfg.shim == ShimConfig(
        socket="/run/gpu-alloc/docker.sock", mode=0o660, group="docker", create_timeout=120.0
    )
    assert cfg.plugin == PluginConfig(socket="/run/docker/plugins/gpu-alloc.sock", workers=2)
    assert cfg.policy == PolicyConfig(placement="best-effort", lock_timeout=5.0, pending_ttl=300.0)
    assert (cfg.state_dir, cfg.gpus) == ("/var/lib/gpu-alloc", "nvml")
    assert cfg.state_dir == "/var/lib/gpu-alloc"


def test_every_key_is_parsed() -> None:
    assert parse(FULL, CFG) == Config(
        engine=EngineConfig(
            socket="/run/docker-alt.sock", timeout=3.5, daemon_json="/etc/docker/alt.json"
        ),
        shim=ShimConfig(socket="/run/gpu-alloc/d.sock", mode=0o640, group="gpu", create_timeout=30),
        plugin=PluginConfig(socket="/run/docker/plugins/x.sock", workers=4),
        policy=PolicyConfig(placement="first-fit", lock_timeout=2, pending_ttl=60.5),
        state_dir="/srv/gpu-alloc",
        gpus="/etc/gpu-alloc/gpus.yaml",
        source=CFG,
    )


def test_a_section_sets_only_its_own_keys_and_the_rest_keep_defaults() -> None:
    cfg = parse("policy: {placement: first-fit}", CFG)
    assert cfg.policy == PolicyConfig(placement="first-fit")
    assert cfg.engine == EngineConfig()


def test_shim_group_may_be_null_to_keep_the_socket_group_unchanged() -> None:
    assert parse("shim: {group: null}", CFG).shim.group is None


@pytest.mark.parametrize(
    ("yaml_value", "mode"),
    [
        ('"0660"', 0o660),
        ('"0600"', 0o600),
        ('"750"', 0o750),
        ('"0o770"', 0o770),
        ("0660", 0o660),  # unquoted: YAML 1.1 already reads a leading 0 as octal
        ("432", 432),  # a plain integer is taken as the mode's numeric value
    ],
)
def test_shim_mode_is_read_as_octal(yaml_value: str, mode: int) -> None:
    assert parse(f"shim: {{mode: {yaml_value}}}", CFG).shim.mode == mode


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("gpus.yaml", "{dir}/gpus.yaml"),
        ("sim/gpus.yaml", "{dir}/sim/gpus.yaml"),
        ("../shared/gpus.yaml", "{parent}/shared/gpus.yaml"),
        ("/opt/gpus.yaml", "/opt/gpus.yaml"),
        ("nvml", "nvml"),
    ],
)
def test_a_relative_gpus_file_is_resolved_against_the_config_files_directory(
    tmp_path: Path, gpus: str, expected: str
) -> None:
    conf_dir = tmp_path / "etc"
    cfg = parse(f"gpus: {gpus}", str(conf_dir / "config.yaml"))
    assert cfg.gpus == expected.format(dir=conf_dir.resolve(), parent=tmp_path.resolve())


def test_load_resolves_gpus_next_to_the_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf" / "config.yaml"
    conf.parent.mkdir()
    conf.write_text("gpus: sim.yaml\n")
    monkeypatch.chdir(tmp_path)
    cfg = load(str(conf))
    assert cfg.gpus == str((tmp_path / "conf" / "sim.yaml").resolve())
    assert cfg.source == str(conf)


# --- what is refused: the message names the file and the dotted key ---------------------------

REFUSED = {
    "unknown top-level key (a typo)": ("state-dir: /x", "state-dir", "unknown key"),
    "unknown section key": ("engine: {sockt: /x}", "engine.sockt", "unknown key"),
    "unknown policy key": ("policy: {placment: numa}", "policy.placment", "unknown key"),
    "string for a number": ('engine: {timeout: "10"}', "engine.timeout", "got str"),
    "boolean for a timeout": ("engine: {timeout: true}", "engine.timeout", "boolean"),
    "boolean for workers": ("plugin: {workers: yes}", "plugin.workers", "boolean"),
    "boolean for lock_timeout": ("policy: {lock_timeout: false}", "policy.lock_timeout", "boolean"),
    "float for workers": ("plugin: {workers: 2.5}", "plugin.workers", "expected int"),
    "boolean for the mode": ("shim: {mode: true}", "shim.mode", "boolean"),
    "not an octal mode": ('shim: {mode: "rw-rw----"}', "shim.mode", "octal"),
    "digit 9 in the mode": ('shim: {mode: "0990"}', "shim.mode", "octal"),
    "number for the group": ("shim: {group: 5}", "shim.group", "expected str or null"),
    "number for gpus": ("gpus: 4", "gpus", "expected str"),
    "list for state_dir": ("state_dir: [/a]", "state_dir", "expected str"),
    "relative engine socket": ("engine: {socket: docker.sock}", "engine.socket", "absolute"),
    "relative shim socket": ("shim: {socket: run/d.sock}", "shim.socket", "absolute"),
    "relative plugin socket": ("plugin: {socket: ./p.sock}", "plugin.socket", "absolute"),
    "relative state_dir": ("state_dir: var/lib/gpu-alloc", "state_dir", "absolute"),
    "relative sysfs": ("sysfs: sys", "sysfs", "absolute"),
    "reserved cpus not a list": (
        "policy: {reserved_cpus: 3-1}",
        "policy.reserved_cpus",
        "CPU list",
    ),
    "reserved cpus as a number": ("policy: {reserved_cpus: 2}", "policy.reserved_cpus", "str"),
    "unknown placement policy": (
        "policy: {placement: random}",
        "policy.placement",
        "one of best-effort",
    ),
    "placement in the wrong case": ("policy: {placement: NUMA}", "policy.placement", "one of"),
    "zero engine timeout": ("engine: {timeout: 0}", "engine.timeout", "greater than zero"),
    "negative lock_timeout": ("policy: {lock_timeout: -1}", "policy.lock_timeout", "greater"),
    "zero pending_ttl": ("policy: {pending_ttl: 0.0}", "policy.pending_ttl", "greater"),
    "zero workers": ("plugin: {workers: 0}", "plugin.workers", "greater than zero"),
    "zero create_timeout": ("shim: {create_timeout: 0}", "shim.create_timeout", "greater"),
    "negative create_timeout": ("shim: {create_timeout: -5}", "shim.create_timeout", "greater"),
    "pending_ttl shorter than the default create_timeout": (
        "policy: {pending_ttl: 100}",
        "policy.pending_ttl",
        "longer than shim.create_timeout (120s)",
    ),
    "pending_ttl equal to create_timeout": (
        "shim: {create_timeout: 60}\npolicy: {pending_ttl: 60}",
        "policy.pending_ttl",
        "longer than shim.create_timeout (60s)",
    ),
    "create_timeout raised past the default pending_ttl": (
        "shim: {create_timeout: 600}",
        "policy.pending_ttl",
        "longer than shim.create_timeout (600s)",
    ),
    "a metrics port in another script's digits": (
        "metrics: {listen: '127.0.0.1:²'}",
        "metrics.listen",
        "expected host:port",
    ),
    "a half-life of a thousand centuries": (
        "policy: {fair_share: {half_life: 99999999d}}",
        "policy.fair_share.half_life",
        "out of range",
    ),
    "malformed fair-share half-life": (
        "policy: {fair_share: {half_life: a week}}",
        "policy.fair_share.half_life",
        "expected a duration such as 24h or 30m, got 'a week'",
    ),
    "fair share without a half-life": (
        "policy: {fair_share: {}}",
        "policy.fair_share.half_life",
        "required",
    ),
    "fair share with an unknown key": (
        "policy: {fair_share: {halflife: 7d}}",
        "policy.fair_share.halflife",
        "unknown key",
    ),
    "section given as a scalar": ("engine: 5", "engine", "mapping"),
    "section given as a string": ("shim: fast", "shim", "mapping"),
    "section given as an empty list": ("engine: []", "engine", "mapping"),
}


@pytest.mark.parametrize(("text", "key", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_value_is_refused_naming_the_file_and_the_dotted_key(
    text: str, key: str, why: str
) -> None:
    msg = refusal(text)
    assert msg.startswith(f"{CFG}: key '{key}': ")
    assert why in msg


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("state-dir: /x", "key 'state-dir': unknown key; did you mean 'state_dir'?"),
        ("policy: {placment: numa}", "did you mean 'policy.placement'?"),
        ("policy: {limits: {defualt: {gpus: 1}}}", "did you mean 'policy.limits.default'?"),
        ("policy: {time_limit: {defalt: 1h}}", "did you mean 'policy.time_limit.default'?"),
        ("policy: {sharing: [{gpus: [0], shares: 2, mdoe: mps}]}", "did you mean"),
    ],
)
def test_a_typo_is_told_the_key_it_was_likely_meant_to_be(text: str, said: str) -> None:
    msg = refusal(text)
    assert said in msg and "known:" not in msg  # one suggestion, not every key


def test_a_key_like_no_other_lists_the_known_ones() -> None:
    assert "unknown key (known: default_pool, engine_socket_binds," in refusal("policy: {zz: 1}")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("- a\n- b\n", "top level must be a mapping"),
        ("just a string", "top level must be a mapping"),
        ("engine: {socket: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_file_that_is_not_a_mapping_of_keys_is_refused_naming_the_file(
    text: str, why: str
) -> None:
    msg = refusal(text)
    assert msg.startswith(f"{CFG}: ")
    assert why in msg


# --- where the file comes from -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("explicit", "env", "expected"),
    [
        ("/cli.yaml", "/env.yaml", "/cli.yaml"),
        ("/cli.yaml", None, "/cli.yaml"),
        (None, "/env.yaml", "/env.yaml"),
        (None, "", config.DEFAULT_PATH),
        (None, None, config.DEFAULT_PATH),
    ],
)
def test_resolve_path_prefers_the_flag_then_the_environment_then_etc(
    monkeypatch: pytest.MonkeyPatch, explicit: str | None, env: str | None, expected: str
) -> None:
    if env is None:
        monkeypatch.delenv(config.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(config.ENV_VAR, env)
    assert resolve_path(explicit) == expected


def test_the_default_path_is_etc_gpu_alloc() -> None:
    assert (config.DEFAULT_PATH, config.ENV_VAR) == (
        "/etc/gpu-alloc/config.yaml",
        "GPU_ALLOC_CONFIG",
    )


def test_load_reads_the_file_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("plugin: {workers: 7}\n")
    monkeypatch.setenv(config.ENV_VAR, str(conf))
    cfg = load()
    assert (cfg.plugin.workers, cfg.source) == (7, str(conf))


def test_a_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"^{missing}: no such config file"):
        load(str(missing))


def test_a_missing_file_named_by_the_environment_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nope.yaml"
    monkeypatch.setenv(config.ENV_VAR, str(missing))
    with pytest.raises(ConfigError, match="no such config file"):
        load()


def test_a_missing_default_file_gives_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "absent.yaml"))
    assert load() == Config()


def test_a_present_default_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "config.yaml"
    default.write_text("policy: {placement: first-fit}\n")
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(default))
    assert load().policy.placement == "first-fit"


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{tmp_path}: cannot read"):
        load(str(tmp_path))  # a directory: IsADirectoryError


def test_a_bad_key_in_a_loaded_file_names_that_file(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("policy:\n  pending_ttl: -3\n")
    with pytest.raises(ConfigError, match=f"^{conf}: key 'policy.pending_ttl'"):
        load(str(conf))


def test_fair_share_half_life_is_a_duration_and_unset_is_off() -> None:
    assert parse("policy: {fair_share: {half_life: 7d}}").policy.rules.fair_share_half_life == (
        7 * 86400.0
    )
    assert parse("").policy.rules.fair_share_half_life is None
