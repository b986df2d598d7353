"""The Kubernetes backend against a local server speaking the DGD / scaling-adapter API."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from fleetplan.connectors.base import ApplyFailed, ConnectorConfigError, InDoubt
from fleetplan.connectors.kubernetes import KubernetesApplier, KubernetesSettings
from tests.connectors.conftest import make_decision

SERVICES = {"prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"}


def applier_for(server, **overrides) -> KubernetesApplier:
    settings = KubernetesSettings(
        dgds={"llama": "llama-dgd"}, services=dict(SERVICES), namespace=server.namespace,
        ready_poll_s=0.01, ready_timeout_s=5.0, backoff_s=0.01, backoff_max_s=0.05,
        request_timeout_s=5.0,
    )
    for key, value in overrides.items():
        setattr(settings, key, value)
    return KubernetesApplier(settings, k8s.Configuration(host=server.url))


@pytest.fixture
async def started(fake_k8s):
    fake_k8s.add_dgd("llama-dgd", {"Frontend": 1, "VllmPrefillWorker": 1, "VllmDecodeWorker": 1})
    applier = applier_for(fake_k8s)
    await applier.start()
    yield fake_k8s, applier
    await applier.stop()


async def test_scales_through_the_scale_subresource(started):
    server, applier = started
    observed = await applier.apply(make_decision(prefill=2, decode=4))
    assert observed == {"prefill": 2, "decode": 4}
    assert server.replicas("llama-dgd") == {"Frontend": 1, "VllmPrefillWorker": 2, "VllmDecodeWorker": 4}
    scales = [(w.path.rsplit("/", 2)[-2], w.body, w.content_type) for w in server.writes]
    assert sorted(scales) == [
        ("llama-dgd-vllmdecodeworker", {"spec": {"replicas": 4}}, "application/merge-patch+json"),
        ("llama-dgd-vllmprefillworker", {"spec": {"replicas": 2}}, "application/merge-patch+json"),
    ]


async def test_unchanged_roles_are_not_patched(started):
    server, applier = started
    await applier.apply(make_decision(prefill=1, decode=3))
    assert [w.path.rsplit("/", 2)[-2] for w in server.writes] == ["llama-dgd-vllmdecodeworker"]


async def test_falls_back_to_a_guarded_json_patch_without_an_adapter(fake_k8s):
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1}, adapters=False)
    applier = applier_for(fake_k8s)
    await applier.start()
    observed = await applier.apply(make_decision(prefill=3, decode=1))
    await applier.stop()
    assert observed == {"prefill": 3, "decode": 1}
    assert fake_k8s.replicas("llama-dgd") == {"VllmPrefillWorker": 3, "VllmDecodeWorker": 1}
    scale_404, dgd_patch = fake_k8s.writes
    assert scale_404.path.endswith("/llama-dgd-vllmprefillworker/scale")
    assert dgd_patch.content_type == "application/json-patch+json"
    assert dgd_patch.body == [
        {"op": "test", "path": "/spec/components/0/name", "value": "VllmPrefillWorker"},
        {"op": "add", "path": "/spec/components/0/replicas", "value": 3},
    ]


async def test_json_patch_rereads_when_the_component_moved(fake_k8s):
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1}, adapters=False)
    fake_k8s.reorder_before_patch = "llama-dgd"
    applier = applier_for(fake_k8s)
    await applier.start()
    await applier.apply(make_decision(prefill=5, decode=1))
    await applier.stop()
    # The first patch's test op failed (422) after the reorder; the retry used the new index.
    patches = [w for w in fake_k8s.writes if w.content_type == "application/json-patch+json"]
    assert [p.body[0]["path"] for p in patches] == ["/spec/components/0/name", "/spec/components/1/name"]
    assert fake_k8s.replicas("llama-dgd") == {"VllmDecodeWorker": 1, "VllmPrefillWorker": 5}


async def test_retries_409_and_5xx_with_backoff(started):
    server, applier = started
    server.fail_next("scale", 409, 503, 500)
    server.fail_next("get", 502)
    observed = await applier.apply(make_decision(prefill=2, decode=1))
    assert observed == {"prefill": 2, "decode": 1}
    assert len(server.writes) == 4  # three refused, one landed
    assert server.replicas("llama-dgd")["VllmPrefillWorker"] == 2


async def test_gives_up_after_max_attempts(started):
    server, applier = started
    server.fail_next("scale", *[500] * 6)
    with pytest.raises(ApplyFailed, match="after 6 attempts"):
        await applier.apply(make_decision(prefill=2, decode=1))
    assert server.replicas("llama-dgd")["VllmPrefillWorker"] == 1


async def test_other_api_errors_fail_at_once(started):
    server, applier = started
    server.fail_next("scale", 403)
    with pytest.raises(ApplyFailed, match="HTTP 403"):
        await applier.apply(make_decision(prefill=2, decode=1))
    assert len(server.writes) == 1


async def test_a_refused_read_of_the_dgd_fails_the_decision_in_one_line(started):
    """A token expired, RBAC changed or the DGD deleted: the first read's refusal left apply as the
    client's ApiException, logged as a backend bug with a traceback and acked with its whole text,
    the HTTP response headers included."""
    server, applier = started
    server.fail_next("get", 403)
    with pytest.raises(ApplyFailed, match=r"^HTTP 403 ") as info:
        await applier.apply(make_decision(prefill=2, decode=1))
    assert "HTTP response headers" not in str(info.value)
    assert server.writes == []


async def test_waits_for_ready_before_and_stable_after(started):
    server, applier = started
    server.unready_polls["llama-dgd"] = 3
    server.settle_polls = 4
    await applier.apply(make_decision(prefill=2, decode=2))
    gets = [s for s in server.seen if s.method == "GET"]
    # 3 unready reads before the change, then reads until the status caught up.
    assert len(gets) >= 3 + 4
    first_write = server.seen.index(server.writes[0])
    assert first_write >= 3


async def test_settles_only_once_the_adapters_replicas_reach_the_dgd_spec(started):
    """Dynamo's operator copies a scaling adapter's replicas into the DGD spec when it
    reconciles: until then the old spec and the old status agree, which is not the target."""
    server, applier = started
    server.adapter_polls = 3
    observed = await applier.apply(make_decision(decision_id=1, prefill=1, decode=3))
    assert observed == {"prefill": 1, "decode": 3}  # not the old counts, reported at once
    # the next decision reads the reconciled spec, so going back to 1 is patched, not skipped
    observed = await applier.apply(make_decision(decision_id=2, prefill=1, decode=1))
    assert observed == {"prefill": 1, "decode": 1}
    assert server.replicas("llama-dgd")["VllmDecodeWorker"] == 1
    assert [w.body for w in server.writes] == [{"spec": {"replicas": 3}}, {"spec": {"replicas": 1}}]


async def test_not_ready_in_time_fails_without_writing(fake_k8s):
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1})
    fake_k8s.unready_polls["llama-dgd"] = 10_000
    applier = applier_for(fake_k8s, ready_timeout_s=0.2)
    await applier.start()
    with pytest.raises(ApplyFailed, match="not Ready"):
        await applier.apply(make_decision(prefill=2, decode=2))
    await applier.stop()
    assert fake_k8s.writes == []


async def test_start_checks_the_dgd_and_its_services(fake_k8s):
    applier = applier_for(fake_k8s)
    with pytest.raises(ConnectorConfigError) as missing:
        await applier.start()
    assert missing.value.field == "--dgd"
    fake_k8s.add_dgd("llama-dgd", {"Frontend": 1, "decode": 1})
    with pytest.raises(ConnectorConfigError) as services:
        await applier.start()
    assert services.value.field == "--service" and "Frontend" in str(services.value)


async def test_start_tells_an_api_not_served_from_a_missing_dgd(fake_k8s, monkeypatch):
    """A 404 is also the answer for a resource the API server does not serve (Dynamo's operator
    not installed, or one without nvidia.com/v1beta1): that is not "the DGD does not exist",
    which sent the operator looking at a DGD ``kubectl get dgd`` shows."""
    from fleetplan.connectors import kubernetes

    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1})
    monkeypatch.setattr(kubernetes, "VERSION", "v1alpha1")  # a version this server does not serve
    with pytest.raises(ConnectorConfigError) as err:
        await applier_for(fake_k8s).start()
    assert "does not exist" not in str(err.value)
    assert "nvidia.com/v1alpha1 dynamographdeployments" in str(err.value)


async def test_start_reports_an_unreachable_api_server(fake_k8s):
    url = fake_k8s.url
    await fake_k8s.stop()
    settings = KubernetesSettings(dgds={"llama": "llama-dgd"}, services=dict(SERVICES),
                                  max_attempts=2, backoff_s=0.01, request_timeout_s=1.0)
    applier = KubernetesApplier(settings, k8s.Configuration(host=url))
    with pytest.raises(ConnectorConfigError) as err:
        await applier.start()
    assert err.value.field == "--kubeconfig"


async def test_a_role_without_a_service_fails_the_decision(fake_k8s):
    fake_k8s.add_dgd("llama-dgd", {"VllmDecodeWorker": 1})
    applier = applier_for(fake_k8s)
    await applier.start()
    with pytest.raises(ApplyFailed, match="no service for role"):
        await applier.apply(make_decision(prefill=2, decode=2))
    await applier.stop()
    assert fake_k8s.writes == []


async def test_recover_settles_only_what_is_already_in_the_spec(started):
    server, applier = started
    done = make_decision(prefill=2, decode=2, decision_id=4)
    await applier.apply(done)
    writes = len(server.writes)
    assert await applier.recover(done) == {"prefill": 2, "decode": 2}
    with pytest.raises(InDoubt):
        await applier.recover(make_decision(prefill=7, decode=2, decision_id=5))
    assert len(server.writes) == writes  # recovery never writes


async def test_a_change_the_operator_has_not_copied_into_the_spec_is_not_skipped(fake_k8s):
    """Decision 1 is acked when its wait runs out, before the operator copied the adapter's 3
    into the DGD spec; decision 2 (back to 1) compares with the adapter, not that stale spec,
    so it is patched rather than skipped."""
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1})
    fake_k8s.adapter_polls = 10_000
    applier = applier_for(fake_k8s, ready_timeout_s=0.1)
    await applier.start()
    try:
        await applier.apply(make_decision(decision_id=1, prefill=1, decode=3))
        await applier.apply(make_decision(decision_id=2, prefill=1, decode=1))
        assert await applier.recover(make_decision(decision_id=2, prefill=1, decode=1)) is not None
    finally:
        await applier.stop()
    assert [w.body for w in fake_k8s.writes] == [{"spec": {"replicas": 3}}, {"spec": {"replicas": 1}}]


async def test_an_adapter_at_zero_is_read_as_zero_not_as_the_stale_spec(fake_k8s):
    """The API server leaves 0 out of a Scale (autoscaling/v1 replicas are omitempty), so an
    adapter scaled to 0 read as "no count" and the DGD spec was taken instead: before the
    operator copied the 0 there, a decision back to 1 found the spec's 1 and skipped the patch,
    leaving the role at 0 engines while the planner counted 1."""
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1})
    fake_k8s.adapter_polls = 10_000
    applier = applier_for(fake_k8s, ready_timeout_s=0.1)
    await applier.start()
    try:
        await applier.apply(make_decision(decision_id=1, prefill=0, decode=1))
        await applier.apply(make_decision(decision_id=2, prefill=1, decode=1))
    finally:
        await applier.stop()
    assert [w.body for w in fake_k8s.writes] == [{"spec": {"replicas": 0}}, {"spec": {"replicas": 1}}]


async def test_an_api_server_lost_after_the_patch_still_reports_the_decision_applied(started):
    """Every target is patched: a failed wait afterwards must not ack "failed" (the planner
    would keep counts the fleet has left); what serves is reported unknown instead."""
    server, applier = started
    server.settle_polls = 10_000
    applier.settings.ready_timeout_s = 0.1
    scale = applier._scale

    async def scale_then_lose_the_server(*args):
        await scale(*args)
        server.fail_next("get", *[503] * 100)

    applier._scale = scale_then_lose_the_server
    assert await applier.apply(make_decision(prefill=1, decode=4)) == {}
    assert server.replicas("llama-dgd")["VllmDecodeWorker"] == 4


async def test_a_failure_after_one_role_was_patched_names_it(started):
    server, applier = started
    scale = applier._scale

    async def refuse_the_second(*args):
        await scale(*args)
        server.fail_next("scale", 403)

    applier._scale = refuse_the_second
    with pytest.raises(ApplyFailed, match=r"HTTP 403.*already patched: decode=4"):
        await applier.apply(make_decision(prefill=2, decode=4))


@pytest.mark.parametrize("code", [401, 403, 404])
async def test_an_api_error_in_the_wait_after_the_patch_still_reports_the_decision_applied(started, code):
    """Like the server lost above, but refused (an expired token, RBAC changed, the DGD gone):
    the targets are patched, so the decision is applied, not a backend error acked "failed"."""
    server, applier = started
    scale = applier._scale

    async def scale_then_refuse(*args):
        await scale(*args)
        server.fail_next("get", *[code] * 100)

    applier._scale = scale_then_refuse
    assert await applier.apply(make_decision(prefill=1, decode=4)) == {}
    assert server.replicas("llama-dgd")["VllmDecodeWorker"] == 4


async def test_an_api_error_reading_the_dgd_after_one_role_was_patched_names_it(fake_k8s):
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1}, adapters=False)
    applier = applier_for(fake_k8s)
    await applier.start()
    _refuse_once_after(applier, "_patch_dgd", fake_k8s, "get")  # the read after the first patch
    try:
        with pytest.raises(ApplyFailed, match=r"HTTP 403.*already patched: decode=4"):
            await applier.apply(make_decision(prefill=2, decode=4))
    finally:
        await applier.stop()


async def test_a_fleet_that_does_not_settle_in_time_is_acked_with_what_serves(started):
    """Not the targets: the planner times a scale-up's startup by an ack whose counts reach
    every target, and the engines are not serving yet."""
    server, applier = started
    server.settle_polls = 10_000
    applier.settings.ready_timeout_s = 0.1
    assert await applier.apply(make_decision(prefill=2, decode=4)) == {"prefill": 1, "decode": 1}
    assert server.replicas("llama-dgd") == {"Frontend": 1, "VllmPrefillWorker": 2, "VllmDecodeWorker": 4}


async def test_a_429_is_retried(started):
    """The API server's priority and fairness answers 429 under load: back off, do not fail."""
    server, applier = started
    server.fail_next("scale", 429)
    assert await applier.apply(make_decision(prefill=2, decode=1)) == {"prefill": 2, "decode": 1}
    assert len(server.writes) == 2 and server.replicas("llama-dgd")["VllmPrefillWorker"] == 2


def test_serving_counts_are_the_available_replicas_and_stable_only_when_all_agree():
    """Ready pods are not yet available (minReadySeconds): what serves is ``availableReplicas``,
    and a component is stable only once desired, updated and serving agree. A component with no
    ``replicas`` has Dynamo's default of 1."""
    from fleetplan.connectors.kubernetes import serving_replicas, spec_replicas

    def dgd(**status):
        return {"spec": {"components": [{"name": "S", "replicas": 3}, {"name": "T"}]},
                "status": {"components": {"S": status}}}

    assert serving_replicas(dgd(readyReplicas=3, availableReplicas=2, updatedReplicas=3), "S") == (2, False)
    assert serving_replicas(dgd(readyReplicas=3, updatedReplicas=3), "S") == (3, True)
    assert serving_replicas(dgd(availableReplicas=3, updatedReplicas=2), "S") == (3, False)
    assert spec_replicas(dgd(), "T") == 1


async def test_a_decision_that_only_lowers_roles_does_not_wait_for_ready(fake_k8s):
    """A scale-up whose pod stays Pending (no GPU) keeps the DGD's Ready condition False until
    that replica goes away. The planner releases a stuck startup by deciding the role down
    (planner.md, Dynamo #14251/#14671): that decision must reach the DGD, not wait for a Ready
    only it can bring and then fail unapplied."""
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 3})
    fake_k8s.unready_polls["llama-dgd"] = 10_000
    applier = applier_for(fake_k8s, ready_timeout_s=0.2)
    await applier.start()
    try:
        observed = await applier.apply(make_decision(prefill=1, decode=2))
    finally:
        await applier.stop()
    assert fake_k8s.replicas("llama-dgd")["VllmDecodeWorker"] == 2
    assert observed == {"prefill": 1, "decode": 2}


async def test_a_decision_waits_only_for_the_roles_it_moves(fake_k8s):
    """A decode replica stays Pending (no GPU, Dynamo #14251): decode never settles and the DGD
    is not Ready. A decision that lowers prefill and keeps decode must be acked once prefill
    serves it; it waited out --ready-timeout for the decode it did not touch (and the DGD's
    Ready), holding the deployment's lane and the planner's loop for 30 minutes."""
    import asyncio

    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 2, "VllmDecodeWorker": 4})
    fake_k8s.pending[("llama-dgd", "VllmDecodeWorker")] = 1
    fake_k8s._sync_status("llama-dgd")
    applier = applier_for(fake_k8s, ready_timeout_s=60.0)
    await applier.start()
    decision = make_decision(prefill=1, decode=4).model_copy(update={"previous": {"prefill": 2, "decode": 4}})
    try:
        observed = await asyncio.wait_for(applier.apply(decision), 10)
    finally:
        await applier.stop()
    assert observed == {"prefill": 1, "decode": 3}
    assert fake_k8s.replicas("llama-dgd") == {"VllmPrefillWorker": 1, "VllmDecodeWorker": 4}


async def test_a_json_patch_refused_as_invalid_fails_with_the_apis_message(fake_k8s):
    """A 422 is also the API server's answer to a value it refuses (schema, CEL rules), not only
    to a failed ``test`` op: when the component has not moved, patching again cannot help, and
    the decision fails at once with the API's reason, not "kept moving"."""
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "VllmDecodeWorker": 1}, adapters=False)
    fake_k8s.fail_next("patch", *[422] * 10)
    applier = applier_for(fake_k8s)
    await applier.start()
    try:
        with pytest.raises(ApplyFailed, match="HTTP 422.*scripted 422"):
            await applier.apply(make_decision(prefill=3, decode=1))
    finally:
        await applier.stop()
    assert len([w for w in fake_k8s.writes if w.content_type == "application/json-patch+json"]) == 1


async def test_a_rebalance_lowers_before_it_raises(fake_k8s):
    """A decision that moves GPUs from one role to the other fits the budget only as a whole.
    If the second patch is refused, what landed must be the cut, not the raise: raised first,
    the fleet would head for 4 + 6 engines where the planner allowed 2 + 6 (Dynamo #12428)."""
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 4, "VllmDecodeWorker": 4})
    applier = applier_for(fake_k8s)
    await applier.start()
    _refuse_once_after(applier, "_scale", fake_k8s, "scale")  # the second role's patch
    try:
        with pytest.raises(ApplyFailed, match=r"already patched: prefill=2"):
            await applier.apply(make_decision(prefill=2, decode=6))
    finally:
        await applier.stop()
    assert fake_k8s.replicas("llama-dgd") == {"VllmPrefillWorker": 2, "VllmDecodeWorker": 4}


async def test_a_role_is_found_by_its_component_type_when_no_component_has_its_name(fake_k8s):
    """Dynamo resolves prefill and decode by the v1beta1 component ``type`` first and by name
    after. A DGD whose prefill worker has another name (a generated DGD, a team's own naming)
    is scaled through that component, not failed on every decision for a missing role."""
    fake_k8s.add_dgd("llama-dgd", {"Frontend": 1, "prefill-worker": 1, "VllmDecodeWorker": 1},
                     types={"Frontend": "frontend", "prefill-worker": "prefill",
                            "VllmDecodeWorker": "decode"})
    applier = applier_for(fake_k8s)
    await applier.start()
    try:
        observed = await applier.apply(make_decision(prefill=2, decode=1))
    finally:
        await applier.stop()
    assert observed == {"prefill": 2, "decode": 1}
    assert fake_k8s.replicas("llama-dgd")["prefill-worker"] == 2


async def test_a_component_named_for_one_role_but_typed_the_other_is_not_taken_by_name(fake_k8s):
    """VllmPrefillWorker typed ``decode`` is a decode worker: taken by its name it scaled prefill
    with decode's engines. The component typed ``prefill`` is prefill's, as in Dynamo."""
    fake_k8s.add_dgd("llama-dgd", {"VllmPrefillWorker": 1, "p": 1},
                     types={"VllmPrefillWorker": "decode", "p": "prefill"})
    applier = applier_for(fake_k8s)
    await applier.start()
    try:
        observed = await applier.apply(make_decision(prefill=3, decode=2))
    finally:
        await applier.stop()
    assert observed == {"prefill": 3, "decode": 2}
    assert fake_k8s.replicas("llama-dgd") == {"VllmPrefillWorker": 2, "p": 3}


def _refuse_once_after(applier, method: str, server, operation: str) -> None:
    """After each call of the applier's ``method``, the API server refuses its next
    ``operation`` with a 403: a refusal that lands once part of the decision was patched."""
    original = getattr(applier, method)

    async def then_refuse(*args):
        await original(*args)
        server.fail_next(operation, 403)

    setattr(applier, method, then_refuse)


def test_a_context_picks_the_cluster_even_inside_a_pod(tmp_path, monkeypatch):
    """connectors.md: the cluster comes from --kubeconfig/--context, else the in-cluster service
    account. A connector run in a pod with --context (and ~/.kube/config or $KUBECONFIG) took
    the in-cluster account and dropped the context: it scaled the DGDs of the cluster it runs
    in, not of the one it was told."""
    from kubernetes import config as k8s_config

    from fleetplan.connectors.kubernetes import load_configuration

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: here\n"
        "clusters:\n- name: here\n  cluster: {server: 'https://here:6443'}\n"
        "- name: remote\n  cluster: {server: 'https://remote:6443'}\n"
        "contexts:\n- name: here\n  context: {cluster: here, user: u}\n"
        "- name: remote\n  context: {cluster: remote, user: u}\n"
        "users:\n- name: u\n  user: {token: t}\n"
    )
    # the client reads $KUBECONFIG (else ~/.kube/config) once, at import
    monkeypatch.setattr(k8s_config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))

    def in_cluster(client_configuration):
        client_configuration.host = "https://in-cluster:443"

    monkeypatch.setattr(k8s_config, "load_incluster_config", in_cluster)
    assert load_configuration(None, "remote").host == "https://remote:6443"
    assert load_configuration(None, None).host == "https://in-cluster:443"
