"""The colony simulator: deterministic, it passes on the code as it is, and it catches
the bugs this project has had or could have. Each mutant below is a patch applied here,
in the test (never a switch in the package), bringing back one bug class; the simulator
must catch each within a bounded number of seeds, with the invariant that names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from meshant import protocol as p
from meshant.core.conversations import inbox
from meshant.core.conversations import model as conversation
from meshant.core.graphs import book as graph_book
from meshant.core.journal import lease
from meshant.core.lifecycle import AttemptEvent
from meshant.core.peers import client_session, forager_session, link
from meshant.core.queen import admission_service as admission
from meshant.core.queen import carry, delivery, outbox
from meshant.core.queen import conversation_service as conversations
from meshant.core.tasks import scheduler as scheduler_mod
from meshant.core.tasks.scheduler import Verdict
from meshant.sim import run as simrun
from meshant.sim.run import Result, run_seed, shrink
from meshant.sim.weather import DEFAULT, PROFILES, Profile


def _first_failure(profile: Profile, seeds: range) -> tuple[int, Result] | None:
    for seed in seeds:
        r = run_seed(seed, profile=profile)
        if r.violation is not None:
            return seed, r
    return None


def test_the_same_seed_runs_the_same_way() -> None:
    a, b = run_seed(7), run_seed(7)
    assert a.trace == b.trace and a.steps == b.steps and a.tasks == b.tasks
    assert run_seed(8).trace != a.trace


def test_the_code_as_it_is_keeps_every_promise() -> None:
    failures = [(s, r.violation) for s in range(60) if (r := run_seed(s)).violation]
    assert failures == []


def test_the_cli_says_one_line_and_exits_by_it() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    r = subprocess.run([sys.executable, "-m", "meshant.sim", "--seeds", "20", "-j", "1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("20 seeds, 0 failed, ") and last.endswith(" s"), last
    one = subprocess.run([sys.executable, "-m", "meshant.sim", "--seed", "3"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert one.returncode == 0 and "q1@1 starts" in one.stdout
    bad = subprocess.run([sys.executable, "-m", "meshant.sim", "--seeds", "0"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# -- the mutants -----------------------------------------------------------------------


@pytest.fixture
def mutate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    yield monkeypatch.setattr


def _caught(profile: Profile, seeds: int, invariant: str | tuple[str, ...]) -> tuple[int, Result]:
    found = _first_failure(profile, range(seeds))
    assert found is not None, f"the mutant survived {seeds} seeds"
    seed, r = found
    names = (invariant,) if isinstance(invariant, str) else invariant
    assert r.violation is not None and r.violation.invariant in names, r.violation
    print(f"caught by seed {seed} (of at most {seeds}): {r.violation}")  # (pytest -s)
    return seed, r


@pytest.mark.slow
def test_mutant_a_late_result_of_a_reissued_attempt_is_accepted(mutate: Any) -> None:
    # The fence forgotten: an attempt the queen moved on from answers for its task. Two
    # rules fence it today: lookup() (a registered forager's late answer) and the stale
    # refs a returning forager's hello lists; the mutant keeps only what the second was
    # made for (ids the queen does not hold at all: a restart's).
    real = scheduler_mod.Scheduler.lookup

    def lookup(self: Any, node: Any, ref: str | None) -> tuple[str, Any]:
        verdict, att = real(self, node, ref)
        if verdict is Verdict.DUPLICATE and att is not None and att.task.current is not None:
            return Verdict.OK, att
        return verdict, att
    real_hello = admission.AdmissionService.hello

    def hello(self: Any, req: Any) -> None:
        real_hello(self, req)
        node = self.registry.by_id.get(req.identity)
        if node is not None and node.stale:
            node.stale = {r for r in node.stale if r not in self.scheduler.attempts} or None
    mutate(scheduler_mod.Scheduler, "lookup", lookup)
    mutate(admission.AdmissionService, "hello", hello)
    profile = DEFAULT.only("pause-forager", "kill-forager")
    seed, r = _caught(profile, 60, "superseded-attempt")
    # And it replays from its seed, shrunk to the faults that matter.
    small = shrink(seed, r, runner=lambda s, d: run_seed(s, d, profile))
    assert small.violation is not None and small.violation.invariant == "superseded-attempt"
    assert 1 <= len(small.faults) <= len(r.faults)


@pytest.mark.slow
def test_mutant_a_client_drops_unsent_submissions_on_reconnect(mutate: Any) -> None:
    def welcomed(self: Any, first: bool) -> None:
        self._lost_at = None
        self.outbox.clear()  # what waited for the queen is dropped, nothing sent again
    mutate(client_session.ClientSession, "welcomed", welcomed)
    _caught(DEFAULT.only("kill-queen", "crash-mid-turn", "client-reconnect"), 40,
            "one-outcome")


@pytest.mark.slow
def test_mutant_a_client_forgets_requests_sent_to_a_lost_queen(mutate: Any) -> None:
    # Seen in a failover test: a request sent to the leader just before it died waited
    # for its timeout (the client re-sent its submissions to the new leader, not its
    # requests). Now a read-only one is asked again and any other fails as queen-lost.
    def welcomed(self: Any, first: bool) -> None:
        self._lost_at = None
        if not first:
            kept = [m for m in self.outbox if isinstance(m, p.Message)]
            self.outbox.clear()
            self.outbox.extend(pend.frames for pend in self.tasks.values())
            self.outbox.extend(kept)
    mutate(client_session.ClientSession, "welcomed", welcomed)
    _caught(PROFILES["conversations"], 20, "request-answered")


@pytest.mark.slow
def test_mutant_a_request_a_new_queen_refused_unread_is_failed_and_sent_again(
        mutate: Any) -> None:
    # Seen in the CI of a kill -9 test: a request the restarted queen refused as from a
    # stranger was failed queen-lost once the client was welcomed back, and sent again
    # all the same (seed 511 of 'conversations' before the fix).
    real = client_session.ClientSession.welcomed

    def welcomed(self: Any, first: bool) -> None:
        resend, self._resend = self._resend, []
        real(self, first)
        self.outbox.extend(resend)
    mutate(client_session.ClientSession, "welcomed", welcomed)
    _caught(PROFILES["conversations"], 100, "failed-request-unsent")


@pytest.mark.slow
def test_mutant_a_deposed_leader_acts_for_one_turn(mutate: Any) -> None:
    real = lease.Roles.step
    swallowed: set[int] = set()

    def step(self: Any, valid: bool, term: int, leader: Any) -> Any:
        t = real(self, valid, term, leader)
        if isinstance(t, lease.StepDown) and id(self) not in swallowed:
            swallowed.add(id(self))
            self.leading = True  # one more turn as the leader it no longer is
            return None
        return t
    mutate(lease.Roles, "step", step)
    _caught(DEFAULT.only("pause-queen", failover=1.0), 200, "acted-while-deposed")


@pytest.mark.slow
def test_mutant_a_reused_assignment_id_is_answered_by_the_old_run(mutate: Any) -> None:
    real = admission.AdmissionService.hello

    def hello(self: Any, req: Any) -> None:
        real(self, req)
        node = self.registry.by_id.get(req.identity)
        if node is not None:
            node.stale = None  # old runs' answers taken for the new assignments'
    mutate(admission.AdmissionService, "hello", hello)
    _caught(DEFAULT.only("crash-mid-turn", "kill-queen", faults=(3, 8), graphs=0.0,
                         asks=0.0, mailbox=0.0), 1000,
            # (or the attempts' table refuses to finish a held attempt never adopted)
            ("superseded-attempt", "no-internal-error"))


@pytest.mark.slow
def test_mutant_a_graph_dependant_is_released_after_its_upstream_failed(mutate: Any) -> None:
    real = graph_book.GraphBook._end

    def _end(self: Any, g: Any, n: Any, state: str, error: Any, *, notify: bool = True) -> None:
        if state == graph_book.FAILED:
            real(self, g, n, graph_book.COMPLETED, None, notify=notify)  # as if it completed
            n.state = state
            return
        real(self, g, n, state, error, notify=notify)
    mutate(graph_book.GraphBook, "_end", _end)
    _caught(DEFAULT.only("late-duplicate", faults=(0, 2), graphs=1.0), 40,
            "graph-dependants")


@pytest.mark.slow
def test_mutant_an_ended_graph_sent_again_is_answered_with_its_end_alone(mutate: Any) -> None:
    # The old answer to a client sending again a graph that ended meanwhile (on a queen
    # that took over, its nodes' results sent to a connection long gone): the graph's
    # summary, none of its nodes' ends, so the client's graph lacked their results.
    mutate(graph_book.GraphBook, "ended_nodes", lambda self, gid: [])
    _caught(DEFAULT.only("kill-queen", "crash-at-commit", faults=(1, 5), graphs=1.0,
                         durable=0.0, failover=1.0), 200, "graph-nodes-heard")


@pytest.mark.slow
def test_mutant_an_answer_is_delivered_to_a_later_attempt(mutate: Any) -> None:
    real = conversations.ConversationService.answer

    def answer(self: Any, req: Any) -> None:
        task = self.scheduler.tasks.get(req.msg.b["task"])
        request = req.msg.b.get("request")
        q = self.questions.get(task.id, request) if task is not None and request else None
        if q is not None and task is not None and task.current is not None:
            q.attempt = task.current.id  # the attempt check forgotten
        real(self, req)
    mutate(conversations.ConversationService, "answer", answer)
    _caught(DEFAULT.only("pause-forager", "kill-forager", faults=(3, 8), asks=1.0), 200,
            "answer-to-asker")


@pytest.mark.slow
def test_mutant_a_kept_inbox_message_is_delivered_twice(mutate: Any) -> None:
    def take(self: Any, name: str) -> list[Any]:
        return list(self.boxes.get(name, ()))  # handed over, and kept all the same
    mutate(inbox.Inboxes, "take", take)
    # (What a queen hands over and keeps all the same is still in its memory, not in
    # its journal: inbox-journaled sees it first, often.)
    _caught(DEFAULT.only("client-reconnect", "kill-queen", faults=(3, 8), mailbox=1.0),
            100, ("inbox-once", "inbox-journaled"))


@pytest.mark.slow
@pytest.mark.parametrize(("verdict", "invariant"), [(True, "fail-fast"),
                                                    (False, "retry-opt-in")])
def test_mutant_a_handler_failure_is_retried_against_its_policy(
        mutate: Any, verdict: bool, invariant: str) -> None:
    # Every handler exception retried (the old default), or none (opt-in ignored).
    mutate(scheduler_mod, "retries", lambda task, err: verdict)
    _caught(DEFAULT.only("kill-forager", faults=(0, 2)), 60, invariant)


@pytest.mark.slow
def test_mutant_a_task_taken_back_hides_its_journaled_updates(mutate: Any) -> None:
    # The bug a gateway test found across a failover: a task taken back from the journal
    # began a fresh update log at its first new update, so an attach from 0 skipped the
    # journaled ones without a cursor-expired.
    mutate(conversation.UpdateLogs, "begin_behind",
           lambda self, task_id, seq: None)
    _caught(DEFAULT.only("kill-queen", "crash-mid-turn", faults=(1, 3), asks=1.0,
                         attaches=1.0), 300, "attach-gapless")


@pytest.mark.slow
def test_mutant_partials_sent_to_a_dead_queen_are_not_sent_again(mutate: Any) -> None:
    # The other half of the gateway's failover finding: what a queen took but did not
    # journal died with it, and the forager never sent it again.
    real = forager_session.ForagerSession.welcomed
    mutate(forager_session.ForagerSession, "welcomed",
           lambda self, first, updates=None: real(self, first, None))
    _caught(DEFAULT.only("kill-queen", "crash-mid-turn", "client-reconnect", "partition",
                         faults=(1, 4)), 100,
            # (a durable sleep's record lost so: its re-run sleeps, and wakes, again)
            ("updates-kept", "wake-once"))


@pytest.mark.slow
def test_mutant_a_partial_sent_twice_is_taken_twice(mutate: Any) -> None:
    mutate(scheduler_mod.Scheduler, "_numbered", staticmethod(lambda att, body, out: True))
    _caught(DEFAULT.only("late-duplicate", "partition", faults=(2, 6)), 100, "updates-kept")


@pytest.mark.slow
def test_mutant_a_batch_to_a_client_reorders_its_updates(mutate: Any) -> None:
    # #26: a turn's progress and partial results for one client leave as one batch
    # (batch.progress); a batch that does not keep their order is caught.
    real = delivery._send_results
    mutate(delivery, "_send_results",
           lambda st, client, items: real(st, client, items[::-1]))
    _caught(DEFAULT, 100, "live-order")


@pytest.mark.slow
def test_mutant_a_forager_batch_reverses_its_items(mutate: Any) -> None:
    # The forager's half: a batch that does not keep the handler's order. The queen
    # takes each update number once, in order, so the earlier ones are lost.
    real = forager_session.ForagerSession._results
    mutate(forager_session.ForagerSession, "_results",
           staticmethod(lambda items: real(items[::-1])))
    # (a durable handler's records go with them: its sleep is made, and woken, again)
    _caught(DEFAULT, 100, ("updates-kept", "wake-once"))


@pytest.mark.slow
def test_mutant_a_turns_records_are_committed_one_by_one(mutate: Any) -> None:
    # Found by seed 215 once the simulated handlers streamed in bursts (#26): a crash
    # between a turn's two commits kept a graph node's task rows without its graph's;
    # the client sent the graph again, the new queen ran the node again, and the
    # node's hash chain was forked. A turn's records now go in one transaction.
    def one_by_one(actions: list[Any]) -> list[Any]:
        return [outbox.Commit([a]) if isinstance(a, outbox._JOURNAL) else a for a in actions]
    mutate(carry, "grouped", one_by_one)
    # (A schedule's tick task written before its cursor is the same split, seen sooner.)
    _caught(DEFAULT, 100, ("turn-atomic", "schedule-cursor"))


def test_a_violation_names_its_invariant_and_the_seed_replays_it(mutate: Any) -> None:
    # The smallest mutant: every result is given to its submitter twice.
    real = simrun.SimClient.do

    def do(self: Any) -> None:
        actions = self.cs.take()
        self.cs.out = [*actions, *(a for a in actions
                                   if isinstance(a, client_session.Ended))]
        real(self)
    mutate(simrun.SimClient, "do", do)
    r = run_seed(0)
    assert r.violation is not None and r.violation.invariant == "one-outcome"
    again = run_seed(0)
    assert again.violation is not None and str(again.violation) == str(r.violation)


def test_an_old_runs_result_is_never_taken_for_a_new_run_of_its_id() -> None:
    # Found while measuring #26 (kept as a strict xfail, seed 359, until #33): a queen
    # dies before journaling a young task, so the queen after it assigns the task's
    # attempt 1 again — the same assign id — to the forager that ran it; the forager kept
    # the first run's result for re-sending, and after the next reconnect sent it again,
    # where it was taken for the new run's. A new assignment of an id now makes the
    # forager forget everything of the old run. (The seed the mutant below meets first.)
    r = run_seed(60, profile=PROFILES["crashes"])
    assert r.violation is None, r.violation


@pytest.mark.slow
def test_mutant_a_reassigned_id_keeps_the_old_runs_result(mutate: Any) -> None:
    mutate(forager_session.ForagerSession, "_forget", lambda self, ref: None)
    _caught(PROFILES["crashes"], 200, ("latest-run-answers", "updates-kept"))


# -- #33's invariants and the bugs the weather found -----------------------------------


@pytest.mark.slow
def test_mutant_a_cancel_never_reaches_the_forager(mutate: Any) -> None:
    def keep_slot(self: Any, task: Any) -> None:
        att = task.current
        if att is not None:  # fenced, its slot kept — and no task.cancel sent
            task.current = None
            self._end_attempt(att, AttemptEvent.FENCE)
    mutate(scheduler_mod.Scheduler, "_abandon_keep_slot", keep_slot)
    _caught(DEFAULT, 60, "cancel-reaches-run")


@pytest.mark.slow
def test_mutant_one_attempt_more_than_max_attempts(mutate: Any) -> None:
    real = scheduler_mod.Scheduler._reissue

    def _reissue(self: Any, task: Any, now: float, why: str, **kw: Any) -> None:
        task.max_attempts += 1  # the off-by-one: gives up one try too late
        try:
            real(self, task, now, why, **kw)
        finally:
            task.max_attempts -= 1
    mutate(scheduler_mod.Scheduler, "_reissue", _reissue)
    _caught(DEFAULT, 200, "attempts-bounded")


@pytest.mark.slow
def test_mutant_a_kept_inbox_message_is_not_journaled(mutate: Any) -> None:
    real = conversations.ConversationService._remember

    def remember(self: Any, **what: Any) -> None:
        what.pop("kept", None)
        if what:
            real(self, **what)
    mutate(conversations.ConversationService, "_remember", remember)
    _caught(DEFAULT, 60, "inbox-journaled")


@pytest.mark.slow
def test_mutant_updates_sent_again_out_of_order(mutate: Any) -> None:
    real = forager_session.ForagerSession.welcomed

    def welcomed(self: Any, first: bool, updates: Any = None) -> None:
        before = len(self.outbox)
        real(self, first, updates)
        again = len(self.outbox) - before
        head = [self.outbox.popleft() for _ in range(again)]
        self.outbox.extendleft(head)  # (extendleft reverses them)
    mutate(forager_session.ForagerSession, "welcomed", welcomed)
    _caught(DEFAULT, 100, "updates-kept")


@pytest.mark.slow
def test_mutant_a_heartbeat_into_a_full_pipe_is_tried_flat_out(mutate: Any) -> None:
    def beat(self: Any) -> None:
        if self.send_now(p.Message("hb", self.role.hb_body(), to="queen")):
            self.sess.sent(self._now, beat=True)
    mutate(link.PeerLink, "_beat", beat)
    _caught(DEFAULT, 100, "no-spin")


@pytest.mark.slow
def test_mutant_a_final_result_numbered_afresh_is_taken_for_a_repeat(mutate: Any) -> None:
    def update(self: Any, kind: str, body: dict[str, Any]) -> bool:
        pend = self.tasks.get(body.get("task", ""))
        if pend is None:
            return False
        if body.get("seq", 0) <= pend.last_seq:
            return True  # the old rule: a final result too
        pend.last_seq = body.get("seq", 0)
        if kind == "task.result" and not body.get("partial"):
            self.forget(body["task"])
            self.out.append(client_session.Ended(body["task"], body))
        else:
            self.out.append(client_session.Update(body["task"], kind, body))
        return True
    mutate(client_session.ClientSession, "update", update)
    _caught(DEFAULT, 60, "one-outcome")


def test_the_cli_measures_a_queens_cost_and_names_its_profiles() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    r = subprocess.run([sys.executable, "-m", "meshant.sim", "--cost", "50", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["foragers"] == 50 and got["messages"] > 50 * 10 and 0 < got["core_share"] < 1
    bad = subprocess.run([sys.executable, "-m", "meshant.sim", "--profile", "nope"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "crashes" in bad.stderr and "Traceback" not in bad.stderr
    one = subprocess.run([sys.executable, "-m", "meshant.sim", "--seeds", "8", "-j", "1",
                          "--profile", "big"], capture_output=True, text=True, timeout=300,
                         env=env)
    assert one.returncode == 0 and one.stdout.strip().splitlines()[-1].startswith(
        "8 seeds, 0 failed"), one.stdout


def test_every_seed_draws_its_own_weather_from_streams_of_its_own() -> None:
    a, b = simrun.Colony(11), simrun.Colony(12)
    assert a.weather != b.weather or a.faults != b.faults
    # Shrinking takes faults away; the workload, the network and the weather stay.
    full, fewer = simrun.Colony(11), simrun.Colony(11, frozenset({0}))
    assert full.weather == fewer.weather and len(fewer.faults) == len(full.faults) - (
        1 if full.faults else 0)
    assert [x for x in run_seed(11, frozenset({0})).trace if " submits " in x] == [
        x for x in run_seed(11).trace if " submits " in x] or not full.faults


# -- #31's invariants: durable agents -----------------------------------------------------


@pytest.mark.slow
def test_mutant_a_rerun_ignores_its_records(mutate: Any) -> None:
    # The records never reach a re-run's handler: it makes its steps again.
    real = forager_session.ForagerSession.assign

    def assign(self: Any, ref: str, body: dict[str, Any], trace: Any, now: float) -> None:
        real(self, ref, {k: v for k, v in body.items() if k not in ("steps", "steps_total")},
             trace, now)
    mutate(forager_session.ForagerSession, "assign", assign)
    _caught(PROFILES["durable"], 40, "step-once")


@pytest.mark.slow
def test_mutant_a_sub_task_keyed_by_attempt(mutate: Any) -> None:
    from meshant.core.queen import task_service
    real = task_service.TaskService.call

    def call(self: Any, req: Any) -> None:
        att = self.scheduler.attempts.get(req.msg.ref or "")
        if att is not None:  # the child's key takes the attempt in: a re-run, a new child
            mutate(task_service, "child_id",
                   lambda parent, pos, n=att.number: f"{parent}/c{pos}.{n}")
        real(self, req)
    mutate(task_service.TaskService, "call", call)
    _caught(PROFILES["durable"], 80, "one-child")


@pytest.mark.slow
def test_mutant_a_sleep_timed_on_the_foragers_clock(mutate: Any) -> None:
    # The queen keeps the forager's idea of the end (another machine's clock): a second
    # early here, as a forager whose clock runs ahead would have it.
    real = scheduler_mod.Scheduler.record_step

    def record_step(self: Any, att: Any, body: dict[str, Any], now: float) -> Any:
        rec = real(self, att, body, now)
        if rec is not None and rec.get("kind") == "sleep":
            rec["until"] -= 1.0
        return rec
    mutate(scheduler_mod.Scheduler, "record_step", record_step)
    _caught(PROFILES["durable"], 60, "wake-on-time")


@pytest.mark.slow
def test_mutant_a_wake_fired_again_after_a_takeover(mutate: Any) -> None:
    # What a task waited for stays in its journal row once it is woken (the column not
    # cleared), and a queen taking over reads any task with a wait as suspended: it
    # wakes it a second time.
    real_wake, real_revive = scheduler_mod.Scheduler.wake, scheduler_mod.revive

    def wake(self: Any, task: Any, now: float, why: str) -> None:
        w = task.wake
        real_wake(self, task, now, why)
        if w is not None and task.state == "queued":
            task.wake = w
    def revive(r: dict[str, Any], to_wall: float) -> Any:
        task = real_revive(r, to_wall)
        if task.wake is not None and task.final is None and task.state != "suspended":
            task.state = scheduler_mod.SUSPENDED
        return task
    mutate(scheduler_mod.Scheduler, "wake", wake)
    mutate(scheduler_mod, "revive", revive)
    _caught(PROFILES["durable"], 200, "wake-once")


@pytest.mark.slow
def test_mutant_a_divergent_rerun_takes_the_record_anyway(mutate: Any) -> None:
    # Replay that keys steps by position alone: a changed handler gets another step's
    # value, and its task completes.
    from meshant.core.tasks import steps as steps_mod
    real = steps_mod.Replay.next

    def next_(self: Any, kind: str, name: str) -> Any:
        pos, occ, rec = real(self, kind, name)
        if isinstance(rec, steps_mod.Divergence):
            return pos, occ, self.steps[pos]
        return pos, occ, rec
    mutate(steps_mod.Replay, "next", next_)
    _caught(PROFILES["durable"], 40, "divergence")
