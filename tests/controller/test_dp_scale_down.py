"""DP scale-down on the controller: the transaction state machine, eligibility, the strategy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from motor_common.domain import Endpoint, EngineType, Instance, Role
from motor_common.errors import Aborted, MotorError
from motor_controller import scale_down as sd
from motor_controller.config import DpScaleDownConfig, FaultToleranceConfig
from motor_controller.fault_policy import (
    DP_SCALE_DOWN,
    ENGINE_RELAUNCH,
    Outcome,
    Progress,
    choose_strategy,
)
from motor_controller.model import FaultReport, InstanceState, ManagedInstance
from motor_controller.push_plan import desired_view
from motor_controller.scale_down import Event, Phase, Record
from motor_controller.strategies.dp_scale_down import DpScaleDown, Target


def instance(n: int = 2) -> Instance:
    eps = tuple(Endpoint(id=i, ip="127.0.0.1", business_port=9000 + i, dp_rank=i, node_id="a") for i in range(n))
    return Instance(id=7, role=Role.UNION, job_name="j", model_name="m", engine_type=EngineType.VLLM, endpoints=eps)


def managed(withdrawn: tuple[int, ...] = ()) -> ManagedInstance:
    return ManagedInstance(7, "j", 0, InstanceState.RECOVERING, instance(), ("a",), "", 0.0,
                           withdrawn_dp_ranks=withdrawn)  # fmt: skip


# --- state machine -----------------------------------------------------------------------------------
def rec(phase: Phase) -> Record:
    return Record(7, "sd-1", phase, (0, 1), (1,))


def test_happy_path_walks_the_table_and_commits_the_dead_ranks() -> None:
    r = rec(Phase.GUARDING)
    seen = []
    while r.in_flight:
        r = sd.advance(r, Event.OK)
        seen.append(r.phase)
    assert seen == [Phase.AWAIT_UNHEALTHY, Phase.WITHDRAWN, Phase.APPLYING, Phase.POLLING, Phase.COMMITTING,
                    Phase.COMMITTED]  # fmt: skip
    assert r.committed_dead_ranks == (1,)


def test_restart_recovery_never_replays_apply() -> None:
    for p in (Phase.GUARDING, Phase.AWAIT_UNHEALTHY, Phase.WITHDRAWN):
        assert sd.advance(rec(p), Event.RESTARTED).phase is Phase.ABORTING  # apply never sent: abort
    assert sd.advance(rec(Phase.APPLYING), Event.RESTARTED).phase is Phase.POLLING  # maybe sent: poll, no apply
    assert sd.advance(rec(Phase.POLLING), Event.RESTARTED).phase is Phase.POLLING
    assert sd.advance(rec(Phase.COMMITTING), Event.RESTARTED).phase is Phase.COMMITTING
    assert all(nxt is not Phase.APPLYING for (p, e), nxt in sd.TRANSITIONS.items() if e is Event.RESTARTED)
    with pytest.raises(sd.TransitionError):
        sd.advance(rec(Phase.COMMITTED), Event.RESTARTED)


def test_withdrawn_ranks_follow_the_phase_and_the_record_round_trips() -> None:
    assert rec(Phase.AWAIT_UNHEALTHY).withdrawn == ()
    assert rec(Phase.POLLING).withdrawn == (1,)
    assert sd.advance(rec(Phase.POLLING), Event.FAIL).withdrawn == ()  # aborting: shown again
    done = sd.advance(rec(Phase.COMMITTING), Event.OK)
    assert done.withdrawn == (1,)
    assert sd.decode(sd.encode(done)) == done


def test_eligibility_needs_dp_capability_a_known_rank_and_a_survivor() -> None:
    inst = instance(2)
    assert sd.eligible(enabled=True, instance=inst, node_capable=[True], dead_ranks=[1]) == (True, "ok")
    assert not sd.eligible(enabled=False, instance=inst, node_capable=[True], dead_ranks=[1])[0]
    assert not sd.eligible(enabled=True, instance=instance(1), node_capable=[True], dead_ranks=[0])[0]
    assert not sd.eligible(enabled=True, instance=inst, node_capable=[True, False], dead_ranks=[1])[0]
    assert not sd.eligible(enabled=True, instance=inst, node_capable=[True], dead_ranks=[])[0]
    assert not sd.eligible(enabled=True, instance=inst, node_capable=[True], dead_ranks=[0, 1])[0]
    assert not sd.eligible(enabled=True, instance=inst, node_capable=[True], dead_ranks=[0], retired=[1])[0]


def test_strategy_choice_falls_back_to_relaunch_when_not_eligible() -> None:
    on = FaultToleranceConfig(enable_fault_tolerance=True, enable_dp_scale_down=True)
    dead = FaultReport("a", 7, 1, "engine_dead", "process_exit", 1, "", 0.0)
    assert choose_strategy(dead, on, scale_down_eligible=True) == DP_SCALE_DOWN
    assert choose_strategy(dead, on, scale_down_eligible=False) == ENGINE_RELAUNCH


def test_coordinators_see_the_instance_without_withdrawn_ranks() -> None:
    active = ManagedInstance(7, "j", 0, InstanceState.ACTIVE, instance(), ("a",), "", 0.0, withdrawn_dp_ranks=(1,))
    view = desired_view([active], {}, wall=0.0)
    assert [e.dp_rank for e in view[7].endpoints] == [0]


# --- the strategy ------------------------------------------------------------------------------------
@dataclass
class Peers:
    states: list[str] = field(default_factory=lambda: ["unhealthy", "unhealthy", "healthy"])
    calls: list[str] = field(default_factory=list)
    fail: dict[str, MotorError] = field(default_factory=dict)
    polls: int = 0

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if what in self.fail:
            raise self.fail[what]

    async def guard(self, address: str, request_id: str, instance_id: int, lease_sec: float,
                    dead_ranks: Sequence[int], *, timeout: float) -> None:  # fmt: skip
        self._call("guard")

    async def apply(self, address: str, request_id: str, instance_id: int, dead_ranks: Sequence[int], *,
                    timeout: float) -> None:  # fmt: skip
        self._call("apply")

    async def finalize(self, address: str, request_id: str, instance_id: int, *, commit: bool,
                       timeout: float) -> list[int]:  # fmt: skip
        self._call("commit" if commit else "abort")
        return []

    async def status(self, address: str, *, timeout: float) -> str:
        s = self.states[min(self.polls, len(self.states) - 1)]
        self.polls += 1
        return s


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, d: float) -> None:
        self.t += d


def strategy(peers: Peers, *, resume: Record | None = None, deadline: float = 30.0) -> tuple[DpScaleDown, list[Record]]:
    saved: list[Record] = []

    async def save(r: Record) -> None:
        saved.append(r)

    clock = Clock()
    ft = FaultToleranceConfig(enable_fault_tolerance=True, enable_dp_scale_down=True,
                              dp_scale_down_config=DpScaleDownConfig(execution_deadline_sec=deadline))  # fmt: skip
    s = DpScaleDown(peers, ft, [Target("a", "a:1")], Progress(), dead_ranks=[1], save=save,
                    deleted=lambda _: False, resume=resume, clock=clock, sleep=clock.sleep)  # fmt: skip
    return s, saved


async def test_commit_path_guards_waits_unhealthy_withdraws_applies_once_and_commits() -> None:
    peers = Peers()
    s, saved = strategy(peers)
    result = await s.run(managed())
    assert result.outcome is Outcome.DONE
    assert peers.calls == ["guard", "apply", "commit"]
    phases = [r.phase for r in saved]
    assert phases.index(Phase.WITHDRAWN) < phases.index(Phase.APPLYING)  # withdrawn before the apply
    assert saved[-1].phase is Phase.COMMITTED and saved[-1].committed_dead_ranks == (1,)


async def test_survivors_never_unhealthy_abort_and_fall_back() -> None:
    peers = Peers(states=["guarded"])
    s, saved = strategy(peers, deadline=3.0)
    result = await s.run(managed())
    assert result.outcome is Outcome.FAILED and "engine_relaunch" in result.detail
    assert peers.calls == ["guard", "abort"]
    assert saved[-1].phase is Phase.ABORTED and saved[-1].withdrawn == ()


async def test_a_stale_request_id_refused_by_a_node_aborts() -> None:
    peers = Peers(fail={"apply": Aborted("stale", reason="SCALE_DOWN_STALE_REQUEST")})
    s, saved = strategy(peers)
    result = await s.run(managed())
    assert result.outcome is Outcome.FAILED
    assert peers.calls == ["guard", "apply", "abort"]
    assert saved[-1].phase is Phase.ABORTED


async def test_survivors_not_healthy_after_apply_abort_within_the_deadline() -> None:
    peers = Peers(states=["unhealthy"])
    s, _ = strategy(peers, deadline=2.0)
    assert (await s.run(managed())).outcome is Outcome.FAILED
    assert peers.calls == ["guard", "apply", "abort"]


async def test_resumed_after_apply_polls_and_commits_without_a_second_apply() -> None:
    peers = Peers(states=["healthy"])
    s, saved = strategy(peers, resume=rec(Phase.APPLYING))
    assert (await s.run(managed((1,)))).outcome is Outcome.DONE
    assert peers.calls == ["commit"] and s.applies_sent == 0
    assert [r.phase for r in saved] == [Phase.POLLING, Phase.COMMITTING, Phase.COMMITTED]


async def test_resumed_before_apply_aborts_without_applying() -> None:
    peers = Peers()
    s, saved = strategy(peers, resume=rec(Phase.WITHDRAWN))
    assert (await s.run(managed((1,)))).outcome is Outcome.FAILED
    assert peers.calls == ["abort"] and s.applies_sent == 0
    assert saved[-1].phase is Phase.ABORTED
