"""Configuration: defaults, and one clear line naming the variable for every bad value."""

import itertools
import json
import math

import pytest

from agent.deadline import LOST_GRACE_S
from agent.hosts import host_allowed
from agent.settings import Settings, SettingsError, TurnConfig


def test_no_configuration_at_all_gives_the_documented_defaults():
    s = Settings.from_env({})
    assert s.redis_url is None
    assert s.turn.provider == "demo"
    assert s.turn.job_timeout_s == 120
    assert s.turn.deadline_margin_s == 20
    assert s.turn.call_timeout_cap_s == 60
    assert s.turn.connect_timeout_s == 10
    assert s.turn.min_call_s == 5
    assert s.turn.max_steps == 8
    assert s.state_ttl_s == 30 * 24 * 3600  # conversations are kept 30 days after their last write
    assert s.poll_interval_ms == 1000
    assert s.workers == 2
    assert s.show_conversations is True
    assert s.max_conversation_bytes == 8 * 1024 * 1024
    assert s.turn.max_history_sent_bytes == 500_000
    assert s.turn.approve_tools == ()  # only the tools that say so themselves ask a person first
    assert s.turn.approval_timeout_s == 600


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"AGENT_JOB_TIMEOUT": "abc"}, "AGENT_JOB_TIMEOUT"),
        ({"AGENT_JOB_TIMEOUT": "-5"}, "AGENT_JOB_TIMEOUT"),
        ({"AGENT_JOB_TIMEOUT": "nan"}, "AGENT_JOB_TIMEOUT"),
        ({"AGENT_JOB_TIMEOUT": "0.5"}, "AGENT_JOB_TIMEOUT"),
        ({"AGENT_DEADLINE_MARGIN": "120"}, "AGENT_DEADLINE_MARGIN"),
        ({"AGENT_DEADLINE_MARGIN": "0"}, "AGENT_DEADLINE_MARGIN"),
        ({"AGENT_MIN_CALL_SECONDS": "61"}, "AGENT_MIN_CALL_SECONDS"),
        ({"AGENT_JOB_TIMEOUT": "10", "AGENT_DEADLINE_MARGIN": "8"}, "AGENT_MIN_CALL_SECONDS"),
        ({"AGENT_CALL_TIMEOUT_CAP": "-1"}, "AGENT_CALL_TIMEOUT_CAP"),
        ({"AGENT_CONNECT_TIMEOUT": "inf"}, "AGENT_CONNECT_TIMEOUT"),
        ({"AGENT_MAX_STEPS": "0"}, "AGENT_MAX_STEPS"),
        ({"AGENT_TOOL_TIMEOUT_CAP": "0"}, "AGENT_TOOL_TIMEOUT_CAP"),
        ({"AGENT_TOOL_TIMEOUT_CAP": "soon"}, "AGENT_TOOL_TIMEOUT_CAP"),
        ({"AGENT_MAX_STEPS": "2.5"}, "AGENT_MAX_STEPS"),
        ({"AGENT_WORKERS": "-1"}, "AGENT_WORKERS"),
        ({"AGENT_STATE_TTL": "soon"}, "AGENT_STATE_TTL"),
        ({"AGENT_STATE_TTL": "3"}, "AGENT_STATE_TTL"),
        ({"AGENT_POLL_INTERVAL_MS": "10"}, "AGENT_POLL_INTERVAL_MS"),
        ({"AGENT_PROVIDER": "gpt"}, "AGENT_PROVIDER"),
        ({"AGENT_PROVIDER": "openai"}, "OPENAI_API_KEY"),
        ({"AGENT_PROVIDER": "anthropic"}, "ANTHROPIC_API_KEY"),
        ({"AGENT_PROVIDER": "openai", "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "ftp://x"}, "OPENAI_BASE_URL"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"AGENT_MCP_START_TIMEOUT": "0"}, "AGENT_MCP_START_TIMEOUT"),
        ({"AGENT_MCP_START_TIMEOUT": "soon"}, "AGENT_MCP_START_TIMEOUT"),
        ({"AGENT_MCP_START_TIMEOUT": "inf"}, "AGENT_MCP_START_TIMEOUT"),
        ({"AGENT_SHOW_CONVERSATIONS": "maybe"}, "AGENT_SHOW_CONVERSATIONS"),
        ({"AGENT_MAX_CONVERSATION_BYTES": "-1"}, "AGENT_MAX_CONVERSATION_BYTES"),
        ({"AGENT_MAX_HISTORY_SENT_BYTES": "10"}, "AGENT_MAX_HISTORY_SENT_BYTES"),
        ({"AGENT_REDIS_MAXMEMORY_MB": "lots"}, "AGENT_REDIS_MAXMEMORY_MB"),
        ({"AGENT_APPROVE_TOOLS": "calculator,send mail"}, "AGENT_APPROVE_TOOLS"),
        ({"AGENT_APPROVE_TOOLS": "time.get_current_time"}, "AGENT_APPROVE_TOOLS"),
        ({"AGENT_APPROVE_TOOLS": "x" * 65}, "AGENT_APPROVE_TOOLS"),
        ({"AGENT_APPROVE_TOOLS": "calculator\nwait"}, "AGENT_APPROVE_TOOLS"),
        ({"AGENT_APPROVAL_TIMEOUT": "0"}, "AGENT_APPROVAL_TIMEOUT"),
        ({"AGENT_APPROVAL_TIMEOUT": "-1"}, "AGENT_APPROVAL_TIMEOUT"),
        ({"AGENT_APPROVAL_TIMEOUT": "soon"}, "AGENT_APPROVAL_TIMEOUT"),
        ({"AGENT_APPROVAL_TIMEOUT": "inf"}, "AGENT_APPROVAL_TIMEOUT"),
        ({"AGENT_APPROVAL_TIMEOUT": str(8 * 24 * 3600)}, "AGENT_APPROVAL_TIMEOUT"),
    ],
)
def test_bad_value_is_refused_in_one_line_naming_the_variable(env, variable):
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")
    assert "\n" not in str(info.value)


# Clocks whose job timeout is 10 s: a state must live at least 10 s plus the lost-worker grace.
TEN_S_JOB = {"AGENT_JOB_TIMEOUT": "10", "AGENT_DEADLINE_MARGIN": "2", "AGENT_MIN_CALL_SECONDS": "1",
             "AGENT_CALL_TIMEOUT_CAP": "5", "AGENT_CONNECT_TIMEOUT": "1"}


def test_a_state_ttl_shorter_than_a_turn_may_run_is_refused_naming_the_variable():
    """AGENT_STATE_TTL=3 with a 5 s model call deleted the conversation mid-turn: every write sets the
    TTL again, but a turn may go its whole job timeout without one, and a lost worker's ending is
    written LOST_GRACE_S after that."""
    least_s = math.ceil(10 + LOST_GRACE_S)
    assert Settings.from_env({**TEN_S_JOB, "AGENT_STATE_TTL": str(least_s)}).state_ttl_s == least_s
    for too_short in (1, 3, 10, least_s - 1):
        with pytest.raises(SettingsError) as info:
            Settings.from_env({**TEN_S_JOB, "AGENT_STATE_TTL": str(too_short)})
        assert info.value.variable == "AGENT_STATE_TTL" and f"at least {least_s} seconds" in str(info.value)
    with pytest.raises(SettingsError, match="AGENT_STATE_TTL"):
        Settings.from_env({"AGENT_STATE_TTL": str(least_s)})  # the default 120 s job timeout needs more


def test_job_timeout_is_cut_to_whole_seconds_as_rq_enforces_it():
    assert Settings.from_env(
        {"AGENT_JOB_TIMEOUT": "14.9", "AGENT_DEADLINE_MARGIN": "2", "AGENT_MIN_CALL_SECONDS": "1"}
    ).turn.job_timeout_s == 14


def test_a_local_openai_compatible_server_needs_no_key():
    s = Settings.from_env({"AGENT_PROVIDER": "openai", "OPENAI_BASE_URL": "http://localhost:11434/v1",
                           "AGENT_MODEL": "llama3.2"})
    assert s.turn.base_url == "http://localhost:11434/v1"
    assert s.turn.model == "llama3.2"


def test_the_tools_that_ask_first_and_how_long_a_request_waits_are_read_and_kept_with_the_turn():
    turn = Settings.from_env({"AGENT_APPROVE_TOOLS": " calculator, time__get_current_time,,calculator ",
                              "AGENT_APPROVAL_TIMEOUT": "90.5"}).turn
    assert turn.approve_tools == ("calculator", "time__get_current_time")  # each once, in order
    assert turn.approval_timeout_s == 90.5
    stored = json.loads(json.dumps(turn.to_dict()))  # as a job carries it: JSON has lists
    assert stored["approve_tools"] == ["calculator", "time__get_current_time"]
    assert TurnConfig.from_dict(stored) == turn
    assert Settings.from_env({"AGENT_APPROVAL_TIMEOUT": str(7 * 24 * 3600)}).turn.approval_timeout_s == 604800


def test_a_turn_stored_before_approvals_reads_with_none_asked():
    stored = {key: value for key, value in TurnConfig().to_dict().items()
              if key not in ("approve_tools", "approval_timeout_s")}
    assert TurnConfig.from_dict(stored).approve_tools == ()
    with pytest.raises(SettingsError, match="AGENT_APPROVAL_TIMEOUT"):
        TurnConfig().with_changes(approval_timeout_s=0)


def test_api_keys_are_not_part_of_the_turn_config():
    s = Settings.from_env({"AGENT_PROVIDER": "openai", "OPENAI_API_KEY": "sk-secret"})
    assert "sk-secret" not in repr(s.turn.to_dict())


# -- the names the page answers at (DNS rebinding) -------------------------------------------------

FOREIGN_NAMES = ["evil.test", "127.0.0.1.evil.test", "localhost.evil.test", "evil.localhost.test", "127.1",
                 "0x7f.0.0.1", "2130706433", "attacker.example", "xn--lcalhost-9za", "localhost..", "[::1].evil.test",
                 "example.com.evil.test", "exampl.com", "example.co", "1.example.com", "10.0.0.6", "[fe80::3]"]
HOST_PORTS = ["", ":80", ":8501", ":65535"]


def test_the_page_answers_only_at_loopback_localhost_the_bound_address_and_configured_names():
    allowed = Settings.from_env({"AGENT_ALLOWED_HOSTS": " Example.COM., 10.0.0.5 ,,fe80::2 "},
                                bound_address="192.168.1.9").allowed_hosts
    good = ["127.0.0.1", "127.0.0.2", "localhost", "LocalHost", "localhost.", "[::1]", "[0:0:0:0:0:0:0:1]",
            "example.com", "EXAMPLE.COM.", "10.0.0.5", "[fe80::2]", "192.168.1.9"]
    for host, port in itertools.product(good, HOST_PORTS):
        assert host_allowed(host + port, allowed), host + port
    assert host_allowed(None, allowed)  # no Host header: not a browser (AppTest sends none)


def test_a_foreign_or_malformed_host_header_is_refused():
    allowed = Settings.from_env({"AGENT_ALLOWED_HOSTS": "example.com,10.0.0.5"}, bound_address="0.0.0.0").allowed_hosts
    bad = [name + port for name, port in itertools.product(FOREIGN_NAMES, HOST_PORTS)]
    for name in ["127.0.0.1", "localhost", "example.com", "[::1]"]:
        bad += [f"user@{name}", f"{name}@evil.test", f"evil.test@{name}", f"{name}/x", f"{name}?x", f"{name}#x",
                f"{name}:", f"{name}:99999", f"{name}:8501:1", f"{name} ", f" {name}", f"{name}\t", f"{name}\r\nX: y",
                f"{name}\\@evil.test", f"{name}.evil.test", f"{name}\u3002evil.test", f"{name}%2eevil.test", ""]
    assert len(bad) > 100
    assert [host for host in bad if host_allowed(host, allowed)] == []
    assert not host_allowed("0.0.0.0:8501", allowed)  # a wildcard bind address is not a name


def test_a_malformed_allowed_host_is_refused_at_start_naming_the_variable():
    for raw in ["http://example.com", "a b", "user@example.com", "example.com/x", "exa\u00e9mple.com", "[::1"]:
        with pytest.raises(SettingsError, match="AGENT_ALLOWED_HOSTS"):
            Settings.from_env({"AGENT_ALLOWED_HOSTS": raw})
    assert Settings.from_env({}).allowed_hosts == ("127.0.0.1", "localhost", "::1")


@pytest.mark.parametrize(("raw", "shown"), [("0", False), ("off", False), ("1", True), ("yes", True)])
def test_the_conversations_list_can_be_hidden(raw, shown):
    assert Settings.from_env({"AGENT_SHOW_CONVERSATIONS": raw}).show_conversations is shown
