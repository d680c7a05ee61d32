"""A reader behind its sender: the backlog is not listed again per message, yet priority holds."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from shoal.core.paths import Layout
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import Directory, send
from shoal.mailbox.store import Maildir
from shoal.mailbox.watcher import Watcher
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams
from tests.polling import wait_until


@pytest.fixture
def watcher() -> Iterator[Watcher]:
    w = Watcher(reconcile_interval=3600)  # (wake-ups come from inotify alone)
    yield w
    w.stop()


def behind(
    teams: Teams, layout: Layout, team: str, watcher: Watcher, n: int
) -> tuple[Directory, Inbox]:
    """Bob's started inbox with `n` messages from carol sent, the first handled: a reader
    behind its sender, holding a cached listing of the rest."""
    d = teams.directory(team)
    box = Inbox(Maildir.open(layout.inbox_dir(team, "bob")), lead=LEAD_NAME, watcher=watcher)
    box.start()
    for i in range(n):
        send(d, to="bob", sender="carol", text=str(i))
    first = box.receive(timeout=10)
    assert first is not None and first.message.text == "0"
    box.ack(first)
    return d, box


def test_shutdown_request_overtakes_a_cached_backlog(
    teams: Teams, layout: Layout, team: str, watcher: Watcher
) -> None:
    d, box = behind(teams, layout, team, watcher, 30)
    send(d, to="bob", sender="carol", kind="shutdown_request", data={"request_id": "r1"})
    wait_until(box._event.is_set, what="the shutdown request's wake-up")
    wait_until(lambda: time.monotonic() >= box._relist_at, what="the look owed to be due")
    nxt = box.receive(timeout=10)
    assert nxt is not None and nxt.message.kind == "shutdown_request"
    box.ack(nxt)
    rest = []
    while (got := box.receive(timeout=0)) is not None:
        rest.append(got.message.text)
        box.ack(got)
    assert rest == [str(i) for i in range(1, 30)]
    box.close()


def test_a_look_owed_is_taken_before_waiting_for_what_where_wants(
    teams: Teams, layout: Layout, team: str, watcher: Watcher
) -> None:
    d, box = behind(teams, layout, team, watcher, 5)
    send(d, to="bob", sender="carol", text="wanted")
    delivery = box.receive(timeout=10, where=lambda m: m.text == "wanted")
    assert delivery is not None and delivery.message.text == "wanted"
    box.ack(delivery)
    box.close()


def test_an_inbox_watch_wakes_and_goes_with_its_last_reader(
    teams: Teams, layout: Layout, team: str, watcher: Watcher
) -> None:
    inbox = layout.inbox_dir(team, "bob")
    box = Inbox(Maildir.open(inbox), lead=LEAD_NAME, watcher=watcher).start()
    assert os.fspath(inbox) in watcher._direct
    send(teams.directory(team), to="bob", sender="carol", text="hi")
    wait_until(box._event.is_set, what="the arrival's wake-up")
    box.close()
    assert watcher._direct == {}
