"""A master checks that the lock key is still *its own* (attached to its lease) at every renewal,
not only that the key's value is its candidate id.

Real etcd; two ``EtcdElection`` candidates with the same candidate id (two coordinators on
different hosts left with the default ``server.host: 0.0.0.0`` and no ``ha.advertise_address``
both advertise ``0.0.0.0:<port>``). The lock key is deleted by hand (an operator's ``etcdctl
del``) while the master's lease lives: the other candidate takes the lock. The old master read the
key, saw its own id and went on serving beside the new one for as long as both ran.
"""

from __future__ import annotations

import aetcd
import pytest

from motor_common.etcd_election import EtcdElection, parse_endpoint
from tests.etcd_server import etcd_server
from tests.helpers import wait_for

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(60)]

KEY = "/motor/lock-ownership/leader"
SAME_ID = "0.0.0.0:9100"


async def test_a_master_whose_key_was_taken_over_under_its_own_id_steps_down() -> None:
    async with etcd_server() as etcd:
        a = EtcdElection([etcd.endpoint], KEY, SAME_ID, ttl=3, check_interval=0.1, call_timeout=1.0)
        b = EtcdElection([etcd.endpoint], KEY, SAME_ID, ttl=3, check_interval=0.1, call_timeout=1.0)
        host, port = parse_endpoint(etcd.endpoint)
        admin = aetcd.Client(host=host, port=port, timeout=2)
        try:
            await a.start()
            await wait_for(lambda: a.current().serving, timeout=10, what="a serving master")
            await b.start()
            await wait_for(lambda: b.view.holder != "", timeout=10, what="b seeing the holder")
            assert not b.current().serving
            await admin.delete(KEY.encode())  # the lock key removed by hand; a's lease lives on
            await wait_for(lambda: b.current().serving, timeout=5, what="b serving master")
            # a's next renewal (every ttl/3 = 1 s) finds the key on another lease: it steps down.
            await wait_for(lambda: not a.current().serving, timeout=3, what="a no longer serving")
            assert b.current().serving
        finally:
            await a.stop()
            await b.stop()
            await admin.close()
