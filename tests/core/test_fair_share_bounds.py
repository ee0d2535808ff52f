"""Fair share keeps bounded tenant state: one-off tenant names (the free-text `user`
field, a new one per request) cost constant memory and admission work, while a tenant
that comes back soon keeps its debt."""

from __future__ import annotations

from factories import make_requests, make_scheduler, run_until_done

from stepserve.core.policies import FairShare


def _tenant_tables(sched) -> int:
    policy = sched.policy
    assert isinstance(policy, FairShare)
    return len(policy.served) + len(policy.live) + len(policy.idle)


def test_forty_thousand_one_off_tenants_leave_bounded_state():
    sched = make_scheduler(policy="fair", max_num_seqs=64)
    bound = FairShare.DEFAULT_MAX_IDLE_TENANTS
    for wave in range(40):
        for i in range(1000):  # 1,000 new tenants per wave, 40,000 in all
            (req,) = make_requests(1, prompt_len=4, max_tokens=2, prefix=f"w{wave}-{i}-",
                                   tenant=f"user-{wave}-{i}")
            sched.add_request(req)
        # while a wave is live its tenants are tracked; idle ones stay within the LRU bound
        assert _tenant_tables(sched) <= 2 * 1000 + bound
        run_until_done(sched)
        assert len(sched.policy.live) == 0 and len(sched.policy.served) == 0
        assert len(sched.policy.idle) <= bound
    assert len(sched.policy.idle) == bound  # full, never over


def test_a_tenant_back_soon_keeps_its_debt():
    sched = make_scheduler(policy="fair", max_num_seqs=1)
    for r in make_requests(3, prompt_len=8, max_tokens=8, prefix="heavy", tenant="heavy"):
        sched.add_request(r)
    run_until_done(sched)
    debt = sched.policy.idle["heavy"]
    assert debt > 0
    # A newcomer queues, then heavy returns with an earlier arrival time: with its debt
    # forgotten both counters would be 0 and heavy would go first by arrival; remembered,
    # the newcomer goes first.
    (n,) = make_requests(1, prefix="new", tenant="newcomer", arrival=1.0)
    (h,) = make_requests(1, prefix="h-again", tenant="heavy", arrival=0.5)
    sched.add_request(n)
    sched.add_request(h)
    assert sched.policy.served == {"newcomer": 0.0, "heavy": debt}
    out = sched.schedule()
    assert [r.request_id for r in out.requests] == ["new0"]


def test_the_oldest_idle_tenant_is_forgotten_first():
    policy = FairShare(max_idle_tenants=2)
    sched = make_scheduler(policy="fair")
    sched.policy = policy
    for name in ("a", "b", "c"):
        (r,) = make_requests(1, prefix=name, tenant=name)
        sched.add_request(r)
        run_until_done(sched)
    assert list(policy.idle) == ["b", "c"]
