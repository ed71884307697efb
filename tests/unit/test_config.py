"""models.toml parsing and validation (localserve/config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localserve.config import (
    DEFAULT_MODEL,
    ConfigError,
    ModelConfig,
    ServerConfig,
    builtin_config,
    configured_model,
    load_config,
    parse_config,
)

VALID_MODEL = """
[models.x]
path = "/models/x.gguf"
"""


def config_error(text: str) -> str:
    """The message of the ConfigError that parsing `text` raises."""
    with pytest.raises(ConfigError) as excinfo:
        parse_config(text)
    return str(excinfo.value)


def model_with(*lines: str) -> str:
    """A models.toml with one valid model `x` plus the given `key = value` lines."""
    return VALID_MODEL + "\n".join(lines) + "\n"


# --- the built-in default --------------------------------------------------------------------


def test_builtin_config_is_the_embedded_gemma_model():
    config = builtin_config()
    assert config.default == DEFAULT_MODEL == "gemma-3-270m"
    assert list(config.models) == [DEFAULT_MODEL]
    model = config.models[DEFAULT_MODEL]
    assert model.embedded is True
    assert model.path is None
    assert model.chat_template == "gemma"


def test_empty_file_gives_the_builtin_default():
    config = parse_config("")
    assert config.default == DEFAULT_MODEL
    assert config.models[DEFAULT_MODEL] == builtin_config().models[DEFAULT_MODEL]
    assert config.scheduler.policy == "continuous"


# --- a valid custom model --------------------------------------------------------------------


def test_custom_model_with_path_is_accepted():
    config = parse_config(
        model_with('chat_template = "chatml"', "n_ctx = 4096", "max_num_seqs = 8")
    )
    x = config.models["x"]
    assert x.path == "/models/x.gguf"
    assert x.embedded is False
    assert (x.chat_template, x.n_ctx, x.max_num_seqs) == ("chatml", 4096, 8)


def test_a_file_that_names_models_serves_only_those_the_first_by_default():
    config = parse_config(VALID_MODEL + '[models.y]\npath = "/models/y.gguf"\n')
    assert list(config.models) == ["x", "y"]  # the embedded toy model is not offered
    assert config.default == "x"


def test_the_embedded_model_is_served_when_the_file_names_it():
    config = parse_config(VALID_MODEL + f"[models.{DEFAULT_MODEL}]\nembedded = true\n")
    assert list(config.models) == ["x", DEFAULT_MODEL]
    assert config.default == DEFAULT_MODEL  # its name stays the default while it is configured


def test_a_default_naming_the_embedded_model_it_does_not_serve_says_how_to():
    message = config_error(f'default = "{DEFAULT_MODEL}"\n' + VALID_MODEL)
    assert f"default: unknown model '{DEFAULT_MODEL}' (known: x)" in message
    assert f"[models.{DEFAULT_MODEL}] embedded = true" in message


def test_configured_model_names_the_key_and_the_models():
    config = parse_config(VALID_MODEL)
    assert configured_model(config, None) == configured_model(config, "x") == "x"
    with pytest.raises(ConfigError, match=r"^--model: unknown model 'y' \(models.toml has: x\)$"):
        configured_model(config, "y", "--model")
    with pytest.raises(ConfigError, match=r"embedded = true"):
        configured_model(config, DEFAULT_MODEL)


def test_default_may_name_a_custom_model():
    config = parse_config('default = "x"\n' + VALID_MODEL)
    assert config.default == "x"


def test_unset_model_keys_take_their_defaults():
    x = parse_config(VALID_MODEL).models["x"]
    assert x == ModelConfig(path="/models/x.gguf")
    assert (x.n_ctx, x.max_num_seqs, x.max_num_batched_tokens) == (8192, 16, 512)


def test_scheduler_section_is_read():
    config = parse_config('[scheduler]\npolicy = "static"\nitl_target_ms = 50.0\n')
    assert config.scheduler.policy == "static"
    assert config.scheduler.itl_target_ms == 50.0


def test_the_openai_default_reply_length_is_read_and_checked():
    assert parse_config("").server.default_max_tokens == 1024
    assert parse_config("[server]\ndefault_max_tokens = 64\n").server.default_max_tokens == 64
    assert "server.default_max_tokens" in config_error("[server]\ndefault_max_tokens = 0\n")


def test_context_overflow_truncates_by_default_and_names_a_wrong_value():
    assert parse_config("").server.context_overflow == "truncate"
    refuse = parse_config('[server]\ncontext_overflow = "refuse"\n')
    assert refuse.server.context_overflow == "refuse"
    assert "server.context_overflow" in config_error('[server]\ncontext_overflow = "shift"\n')


def test_allowed_origins_are_web_or_extension_origins_in_lower_case():
    text = '[server]\nallowed_origins = ["HTTPS://Chat.Example.org/", "chrome-extension://abc"]\n'
    assert parse_config(text).server.allowed_origins == [
        "https://chat.example.org",
        "chrome-extension://abc",
    ]
    for bad in ["*", "null", "chat.example.org", "https://x/path", "file://x", "https://"]:
        text = f'[server]\nallowed_origins = ["{bad}"]\n'
        assert "allowed_origins" in config_error(text), bad


# --- errors name the key ---------------------------------------------------------------------

MODEL_FIELD_ERRORS = [
    pytest.param(model_with("n_ctxx = 4096"), "n_ctxx", id="unknown-key"),
    pytest.param(model_with('n_ctx = "big"'), "n_ctx", id="wrong-type"),
    pytest.param(model_with("n_ctx = 100"), "n_ctx", id="n_ctx-too-small"),
    pytest.param(model_with("max_num_seqs = 300"), "max_num_seqs", id="too-many-seqs"),
    pytest.param(model_with('flash_attn = "yes"'), "flash_attn", id="bad-literal"),
    pytest.param(model_with('cache_type_k = "q5_1"'), "cache_type_k", id="kv-type"),
    pytest.param(
        model_with('cache_type_v = "q4_0"\nflash_attn = "off"'),
        "cache_type_v",
        id="quantized-v-without-flash-attention",
    ),
    pytest.param(model_with('split_mode = "tensor"'), "split_mode", id="split-mode"),
    pytest.param(model_with("tensor_split = [1, -2]"), "tensor_split", id="negative-share"),
    pytest.param(model_with("tensor_split = [0, 0]"), "tensor_split", id="all-zero-shares"),
    pytest.param(model_with("main_gpu = 16"), "main_gpu", id="main-gpu"),
    pytest.param(model_with('use_mmap = "no"'), "use_mmap", id="use-mmap"),
    pytest.param(model_with("offload_kqv = 1"), "offload_kqv", id="offload-kqv"),
]


def test_the_gpu_and_kv_keys_are_read():
    text = model_with(
        'cache_type_k = "q8_0"\ncache_type_v = "q8_0"\nsplit_mode = "row"\n'
        "tensor_split = [3, 1]\nmain_gpu = 1\noffload_kqv = false\n"
        "use_mmap = false\nuse_mlock = true"
    )
    model = parse_config(text).models["x"]
    assert (model.cache_type_k, model.cache_type_v, model.split_mode) == ("q8_0", "q8_0", "row")
    assert (model.tensor_split, model.main_gpu) == ([3.0, 1.0], 1)
    assert not model.offload_kqv and not model.use_mmap and model.use_mlock


@pytest.mark.parametrize(("text", "field"), MODEL_FIELD_ERRORS)
def test_model_field_error_names_the_field(text, field):
    message = config_error(text)
    assert any(f"{field}{end}" in message for end in ("`", ":", "[")), message
    assert "models" in message


@pytest.mark.parametrize(("text", "field"), MODEL_FIELD_ERRORS)
def test_model_field_error_names_the_full_key(text, field):
    assert f"models.x.{field}" in config_error(text)


def test_wrong_type_error_says_what_was_expected():
    message = config_error(model_with('n_ctx = "big"'))
    assert "int" in message and "str" in message


def test_too_few_batched_tokens_for_max_num_seqs_names_the_key():
    message = config_error(model_with("max_num_seqs = 32", "max_num_batched_tokens = 16"))
    assert "models.x.max_num_batched_tokens" in message
    assert "max_num_seqs" in message


def test_both_path_and_embedded_is_an_error_naming_the_model():
    message = config_error(model_with("embedded = true"))
    assert "models.x" in message
    assert "path" in message and "embedded" in message


def test_neither_path_nor_embedded_is_an_error_naming_the_model():
    message = config_error("[models.x]\nn_ctx = 4096\n")
    assert "models.x" in message
    assert "path" in message and "embedded" in message


def test_empty_path_counts_as_no_path():
    assert "models.x" in config_error('[models.x]\npath = ""\n')


def test_unknown_default_model_is_an_error_listing_the_known_ones():
    message = config_error('default = "nope"\n' + VALID_MODEL)
    assert "default" in message and "'nope'" in message and "(known: x)" in message
    assert "embedded = true" not in message  # the hint is for the embedded model's name only


def test_invalid_toml_is_a_config_error_naming_the_source():
    with pytest.raises(ConfigError, match=r"my\.toml: not valid TOML"):
        parse_config("[models.x\n", source="my.toml")


def test_unknown_scheduler_key_is_named():
    message = config_error("[scheduler]\nitl_target = 100\n")
    assert "`scheduler.itl_target`" in message


def test_bad_policy_name_is_named():
    message = config_error('[scheduler]\npolicy = "fifo"\n')
    assert "scheduler.policy" in message
    assert "fifo" in message


def test_unknown_top_level_key_is_named():
    assert "`foo`: unknown key" in config_error("foo = 1\n")


def test_error_messages_do_not_leak_msgspec_paths():
    assert "$" not in config_error('[scheduler]\npolicy = "fifo"\n')


# --- load_config -----------------------------------------------------------------------------


def write_toml(directory: Path, text: str, name: str = "models.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_load_config_resolves_relative_path_against_the_file_directory(tmp_path, monkeypatch):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    toml = write_toml(conf_dir, '[models.x]\npath = "weights/x.gguf"\n')
    monkeypatch.chdir(tmp_path)  # not the file's directory
    config = load_config(toml)
    assert config.models["x"].path == str((conf_dir / "weights" / "x.gguf").resolve())


def test_load_config_keeps_absolute_and_home_paths(tmp_path):
    toml = write_toml(
        tmp_path,
        '[models.a]\npath = "/abs/a.gguf"\n[models.h]\npath = "~/h.gguf"\n',
    )
    config = load_config(toml)
    assert config.models["a"].path == "/abs/a.gguf"
    assert config.models["h"].path == "~/h.gguf"


def test_load_config_reads_localserve_models_env_var(tmp_path, monkeypatch):
    toml = write_toml(tmp_path, 'default = "x"\n' + VALID_MODEL, name="elsewhere.toml")
    monkeypatch.setenv("LOCALSERVE_MODELS", str(toml))
    assert load_config().default == "x"


def test_load_config_explicit_path_wins_over_env_var(tmp_path, monkeypatch):
    env_toml = write_toml(tmp_path, 'default = "x"\n' + VALID_MODEL, name="env.toml")
    arg_toml = write_toml(tmp_path, "", name="arg.toml")
    monkeypatch.setenv("LOCALSERVE_MODELS", str(env_toml))
    assert load_config(arg_toml).default == DEFAULT_MODEL


def test_load_config_reads_models_toml_in_the_working_directory(tmp_path, monkeypatch):
    write_toml(tmp_path, 'default = "x"\n' + VALID_MODEL)
    monkeypatch.delenv("LOCALSERVE_MODELS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert load_config().default == "x"


def test_load_config_without_any_file_gives_builtins(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCALSERVE_MODELS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert load_config() == builtin_config()


def test_load_config_missing_file_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSERVE_MODELS", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config()


def test_load_config_errors_name_the_file(tmp_path):
    toml = write_toml(tmp_path, '[scheduler]\npolicy = "fifo"\n')
    with pytest.raises(ConfigError, match=str(toml)):
        load_config(toml)


# --- ModelConfig.threads ---------------------------------------------------------------------


def test_threads_zero_resolves_to_the_core_count(monkeypatch):
    monkeypatch.setattr("localserve.config.os.cpu_count", lambda: 6)
    assert ModelConfig(embedded=True).threads() == (6, 6)


def test_threads_batch_zero_follows_n_threads():
    assert ModelConfig(embedded=True, n_threads=4).threads() == (4, 4)


def test_threads_explicit_values_are_kept():
    assert ModelConfig(embedded=True, n_threads=4, n_threads_batch=2).threads() == (4, 2)


def test_threads_unknown_core_count_falls_back_to_one(monkeypatch):
    monkeypatch.setattr("localserve.config.os.cpu_count", lambda: None)
    assert ModelConfig(embedded=True).threads() == (1, 1)


def test_a_ttft_target_within_one_step_is_refused():
    message = config_error("[scheduler]\nitl_target_ms = 200\nttft_target_ms = 150\n")
    assert "ttft_target_ms" in message and "itl_target_ms" in message


def test_a_jinja_chat_template_file_is_found_beside_models_toml(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "qwen.jinja").write_text("{{ messages }}", encoding="utf-8")
    toml = tmp_path / "models.toml"
    toml.write_text('[models.x]\npath = "x.gguf"\nchat_template = "templates/qwen.jinja"\n')
    assert load_config(toml).models["x"].chat_template == str(tmp_path / "templates/qwen.jinja")


def test_a_missing_jinja_chat_template_file_names_the_key(tmp_path):
    toml = tmp_path / "models.toml"
    toml.write_text('[models.x]\npath = "x.gguf"\nchat_template = "/nowhere/t.jinja"\n')
    with pytest.raises(ConfigError, match=r"models\.x\.chat_template: no such file: /nowhere/t"):
        load_config(toml)


def test_a_chat_template_name_stays_a_name(tmp_path):
    toml = tmp_path / "models.toml"
    toml.write_text('[models.x]\npath = "x.gguf"\nchat_template = "chatml"\n')
    assert load_config(toml).models["x"].chat_template == "chatml"


def test_trusted_frontends_and_their_peoples_quotas_are_server_keys():
    config = parse_config(
        '[server]\ntrusted_frontends = ["openwebui"]\nmax_people_per_frontend = 8\n'
        '[server.daily_tokens_per_user]\n"openwebui/alice" = 5000\n'
    )
    assert config.server.trusted_frontends == ["openwebui"]
    assert config.server.max_people_per_frontend == 8
    assert config.server.daily_tokens_per_user == {"openwebui/alice": 5000}
    assert ServerConfig().max_people_per_frontend == 256
    with pytest.raises(ConfigError, match="server.max_people_per_frontend"):
        parse_config("[server]\nmax_people_per_frontend = 0\n")


def test_one_user_holds_a_quarter_of_the_websockets_unless_told_otherwise():
    assert ServerConfig().connections_per_user == 16  # of max_connections = 64
    assert ServerConfig(max_connections=2).connections_per_user == 1  # never 0: none at all
    told = parse_config("[server]\nmax_connections = 8\nmax_connections_per_user = 8\n")
    assert told.server.connections_per_user == 8
    with pytest.raises(ConfigError, match="server.max_connections_per_user"):
        parse_config("[server]\nmax_connections_per_user = -1\n")
