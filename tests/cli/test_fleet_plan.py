"""The pure fleet plan behind `motor up`."""

from __future__ import annotations

from pathlib import Path

import pytest

from motor_cli.fleet import FleetOptions, node_names, plan_fleet
from motor_common.errors import ConfigError


def opts(**kw: object) -> FleetOptions:
    base: dict[str, object] = {"node_ports": (7001, 7002), "state_dir": Path("/s"), "key_file": Path("/s/k")}
    base.update(kw)
    return FleetOptions(**base)  # type: ignore[arg-type]


def test_default_fleet_is_one_prefill_and_one_decode_wired_to_one_controller_and_coordinator() -> None:
    plan = plan_fleet(opts(), Path("/bin"))
    kinds = [p.kind for p in plan.programs]
    assert kinds == ["coordinator", "controller", "nodemanager", "nodemanager", "gateway"]
    ctl = plan.of_kind("controller")[0].config
    assert ctl["coordinators"] == ["127.0.0.1:9100"] and ctl["store"]["path"] == "/s/controller.db"
    p, d = plan.of_kind("nodemanager")
    assert (p.config["role"], d.config["role"]) == ("prefill", "decode")
    assert p.config["controller_address"] == "127.0.0.1:9200" and p.config["server"]["port"] == 7001
    assert p.config["engine"]["launcher"] == "simulator"
    assert all("management_key_file" not in spec.config["server"] for spec in plan.programs if "server" in spec.config)
    assert plan.of_kind("gateway")[0].argv[0] == "/bin/motor-gateway"


def test_overrides_are_deep_merged_into_the_program_config() -> None:
    plan = plan_fleet(opts(overrides={"nodemanager": {"engine": {"launcher": "vllm", "model_path": "/m"}}}), Path("/b"))
    engine = plan.of_kind("nodemanager")[0].config["engine"]
    assert engine["launcher"] == "vllm" and engine["model_path"] == "/m" and "log_dir" in engine


def test_a_role_sections_engine_keeps_the_fleets_engine_log_dir() -> None:
    """A role's `engine` replaces the top-level one in the nodemanager: without this, the engines of
    a role section would log into their nodemanager's output instead of logs/."""
    over = {"nodemanager": {"prefill": {"engine": {"launcher": "vllm", "env": {"X": "0"}}},
                            "decode": {"engine": {"launcher": "vllm", "log_dir": "/own"}}}}
    p, d = plan_fleet(opts(overrides=over), Path("/b")).of_kind("nodemanager")
    assert p.config["prefill"]["engine"] == {"log_dir": "/s/logs", "launcher": "vllm", "env": {"X": "0"}}
    assert d.config["decode"]["engine"]["log_dir"] == "/own"
    assert p.config["engine"]["log_dir"] == "/s/logs"


def test_gateway_workers_reach_the_gateway_config() -> None:
    assert "workers" not in plan_fleet(opts(), Path("/b")).of_kind("gateway")[0].config
    assert plan_fleet(opts(gateway_workers=3), Path("/b")).of_kind("gateway")[0].config["workers"] == 3
    with pytest.raises(ConfigError, match=r"--gateway-workers must be in \[1, 256\], got 0"):
        opts(gateway_workers=0)


def test_bad_fleets_are_refused_with_a_clear_message() -> None:
    with pytest.raises(ConfigError, match="unknown fleet config section"):
        opts(overrides={"gatway": {}})
    with pytest.raises(ConfigError, match="at least one prefill and one decode"):
        opts(decode=0, node_ports=(1,))
    with pytest.raises(ConfigError, match="need 3 nodemanager ports"):
        opts(prefill=2)


def test_node_names_are_stable_per_role() -> None:
    assert node_names(opts(prefill=2, decode=1, union=1, node_ports=(1, 2, 3, 4))) == [
        ("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode"), ("union-0", "union")]


def test_ha_plan_puts_both_coordinators_and_the_controller_on_etcd() -> None:
    plan = plan_fleet(opts(coordinator_ports=(9100, 9101), etcd_endpoint="127.0.0.1:2379"), Path("/bin"))
    coords = plan.of_kind("coordinator")
    assert [c.name for c in coords] == ["coordinator-0", "coordinator-1"]
    for c, port in zip(coords, (9100, 9101), strict=True):
        assert c.config["ha"]["etcd_endpoints"] == ["127.0.0.1:2379"]
        assert c.config["ha"]["advertise_address"] == f"127.0.0.1:{port}"
        assert c.config["controller_address"] == plan.controller_address
    ctl = plan.of_kind("controller")[0].config
    assert ctl["store"]["backend"] == "etcd" and ctl["store"]["etcd_endpoints"] == ["127.0.0.1:2379"]
    assert ctl["ha"]["election_key"] != coords[0].config["ha"]["election_key"]
    assert ctl["coordinators"] == plan.coordinator_addresses
    assert plan.of_kind("gateway")[0].config["coordinators"] == plan.coordinator_addresses


def test_plan_without_etcd_has_no_ha_and_the_embedded_store() -> None:
    plan = plan_fleet(opts(), Path("/bin"))
    assert "ha" not in plan.of_kind("coordinator")[0].config
    assert plan.of_kind("controller")[0].config["store"]["backend"] == "embedded"
    assert "ha" not in plan.of_kind("controller")[0].config


def test_motor_up_places_program_ports_outside_the_ephemeral_range_and_never_twice() -> None:
    """Engines and tests pick ports from the kernel's ephemeral range; `motor up` reserves its
    programs' ports outside it, so nothing can take one before its program binds it."""
    import argparse
    import socket

    from motor_cli.up import build_options, configure
    from motor_common.ports import ephemeral_range

    parser = argparse.ArgumentParser()
    configure(parser)
    low, high = ephemeral_range()
    with socket.socket() as held:  # the default coordinator port is busy
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            held.bind(("127.0.0.1", 9100))
            held.listen()
        except OSError:
            pass  # already busy: what the test needs anyway
        o = build_options(parser.parse_args(["--ha", "--port", "0", "--prefill", "2", "--decode", "1"]))
    ports = [o.gateway_port, *o.coordinator_ports, o.controller_port, *o.node_ports]
    assert len(set(ports)) == len(ports) == 7
    assert not any(low <= p <= high for p in ports), (ports, (low, high))
    assert 9100 not in o.coordinator_ports


def test_picked_ports_skip_the_ports_other_motor_ups_claim() -> None:
    """A port another running motor up serves on (its program may be down for a restart, so the
    port is free right now) is never picked."""
    import argparse

    from motor_cli.up import _fleet_ports, build_options, configure

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--port", "0", "--prefill", "1", "--decode", "1"])
    free = build_options(args)
    claimed = frozenset(_fleet_ports(free))
    o = build_options(args, claimed)
    assert not claimed & set(_fleet_ports(o)), (claimed, _fleet_ports(o))
    assert len(set(_fleet_ports(o))) == len(_fleet_ports(o)) == 5  # gateway, coordinator, controller, 2 nodes


def test_each_program_presents_its_own_key_and_accepts_only_its_roles() -> None:
    plan = plan_fleet(opts(), Path("/b"))
    keys = plan.keys
    by = {p.name: p.config for p in plan.programs}
    assert keys.operator == Path("/s/k") and keys.own["gateway"] == Path("/s/keys/gateway.key")
    ctl = by["controller"]["server"]["auth"]
    assert ctl == {"operator_keys_file": "/s/keys/operators.keys", "key_file": "/s/keys/controller.key",
                   "node_keys_file": "/s/keys/nodes.keys"}
    coord = by["coordinator"]["server"]["auth"]
    assert coord["inference_keys_file"] == "/s/keys/inference.keys" and "node_keys_file" not in coord
    assert coord["key_file"] == "/s/keys/coordinator.key"
    nm = by["prefill-0"]["server"]["auth"]
    assert nm == {"operator_keys_file": "/s/keys/operators.keys", "key_file": "/s/keys/prefill-0.key"}
    assert by["gateway"]["coordinator_key_file"] == "/s/keys/gateway.key"
    assert keys.named("operators") == {"controller": Path("/s/keys/controller.key")}
    assert set(keys.named("nodes")) == {"coordinator", "prefill-0", "decode-0"}
    assert keys.named("inference") == {"gateway": Path("/s/keys/gateway.key")}


def test_co_located_plan_has_no_gateway_and_the_coordinator_serves_the_front_on_its_port() -> None:
    plan = plan_fleet(opts(co_located=True, gateway_port=8123), Path("/b"))
    assert [p.kind for p in plan.programs] == ["coordinator", "controller", "nodemanager", "nodemanager"]
    assert plan.of_kind("coordinator")[0].config["http"] == {"host": "127.0.0.1", "port": 8123}
    assert plan.gateway_url == "http://127.0.0.1:8123"
    assert (plan.topology.name, plan.topology.front_program) == ("co-located", "coordinator")
    assert "gateway" not in plan.keys.own and plan.keys.named("inference") == {}
    assert "http" not in plan_fleet(opts(), Path("/b")).of_kind("coordinator")[0].config


def test_co_located_front_serves_https_with_the_coordinators_certificate_under_tls() -> None:
    http = plan_fleet(opts(co_located=True, tls=True), Path("/b")).of_kind("coordinator")[0].config["http"]
    assert http["tls"] == {"cert_file": "/s/tls/coordinator.pem", "key_file": "/s/tls/coordinator.key",
                           "require_client_cert": False}


@pytest.mark.parametrize(("kw", "message"), [
    ({"coordinator_ports": (9100, 9101)}, "--co-located and --ha do not combine: with two coordinators only the "
                                          "gateway fails over between them"),
    ({"gateway_workers": 2}, "--co-located and --gateway-workers 2 do not combine: there is no gateway process "
                             "(the coordinator serves the OpenAI front); use --front-workers 2"),
    ({"overrides": {"gateway": {"workers": 2}}}, "the fleet config's `gateway` section does nothing with --co-located"),
    ({"overrides": {"coordinator": {"http": {"port": 1}}}}, "coordinator.http.port is set by `motor up --co-located` "
                                                            "(from --port)"),
    ({"overrides": {"coordinator": {"http": {"host": "::"}}}}, "coordinator.http.host is set by"),
])
def test_what_does_not_combine_with_co_located_is_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        opts(co_located=True, **kw)
    assert message in refused.value.message
    opts(**kw)  # the same options with the gateway are fine


def test_front_workers_reach_the_co_located_coordinators_http_section() -> None:
    plan = plan_fleet(opts(co_located=True, gateway_port=8123, front_workers=3), Path("/b"))
    assert plan.of_kind("coordinator")[0].config["http"] == {"host": "127.0.0.1", "port": 8123, "workers": 3}
    assert plan.front_workers == 3
    # Not given: the fleet config's http.workers (deep-merged), or the coordinator's default 1.
    over = plan_fleet(opts(co_located=True, overrides={"coordinator": {"http": {"workers": 4}}}), Path("/b"))
    assert over.of_kind("coordinator")[0].config["http"]["workers"] == 4 and over.front_workers == 4
    assert plan_fleet(opts(co_located=True), Path("/b")).front_workers == 1
    # With the gateway, the front's workers are the gateway's.
    assert plan_fleet(opts(gateway_workers=3), Path("/b")).front_workers == 3
    assert plan_fleet(opts(), Path("/b")).front_workers == 1


@pytest.mark.parametrize("workers", [0, 65, -1])
def test_front_workers_out_of_range_are_refused(workers: int) -> None:
    with pytest.raises(ConfigError) as refused:
        opts(co_located=True, front_workers=workers)
    assert refused.value.message == f"--front-workers must be in [1, 64], got {workers}"


def test_front_workers_without_co_located_are_refused_naming_gateway_workers() -> None:
    with pytest.raises(ConfigError) as refused:
        opts(front_workers=2)
    assert refused.value.message == (
        "--front-workers 2 needs --co-located: it runs the coordinator's own OpenAI front as worker processes; "
        "with the gateway (the default topology) use --gateway-workers 2 for more front processes, or add "
        "--co-located")


def test_front_workers_and_the_fleet_configs_http_workers_are_refused_together() -> None:
    with pytest.raises(ConfigError) as refused:
        opts(co_located=True, front_workers=2, overrides={"coordinator": {"http": {"workers": 4}}})
    assert refused.value.message == ("coordinator.http.workers is set twice: 4 in the fleet config and "
                                     "--front-workers 2; keep one of them")


def test_gateway_workers_and_the_fleet_configs_gateway_workers_are_refused_together() -> None:
    with pytest.raises(ConfigError) as refused:
        opts(gateway_workers=2, overrides={"gateway": {"workers": 3}})
    assert refused.value.message == ("gateway.workers is set twice: 3 in the fleet config and "
                                     "--gateway-workers 2; keep one of them")
    # either one alone is taken
    assert opts(gateway_workers=2).gateway_workers == 2
    opts(overrides={"gateway": {"workers": 3}})


def test_a_config_check_that_hangs_is_killed_and_named_not_waited_for(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``motor up --dry-run`` runs every program's ``--check-config`` at once: one that hangs (here
    a gateway that sleeps) is killed at the deadline and named; the others' results still count."""
    from motor_cli import up

    for name, body in (("motor-gateway", "exec sleep 60"), ("motor-controller", "echo 'error: bad key' >&2; exit 2"),
                       ("motor-coordinator", "exit 0"), ("motor-nodemanager", "exit 0")):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setattr(up, "CHECK_CONFIG_TIMEOUT_SEC", 1.0)
    errors = up._check_configs(plan_fleet(opts(), tmp_path), None)
    assert errors == ["bad key", "the gateway did not finish checking its configuration within 1 s (killed)"], errors
