"""The Kubernetes adapter: `agent.kube.api.KubeApi` with the real `kubernetes` client, the only module
that imports it (.importlinter).

What each call is on the wire, and the RBAC the agent's ServiceAccount needs for it (the chart's
ClusterRole; a Role in one namespace is enough for the pods when `KubeSettings.namespace` is set):

    pods    list, watch   GET /api/v1/pods?fieldSelector=spec.nodeName=<node> (or
                          /api/v1/namespaces/<ns>/pods), watch=1 with allowWatchBookmarks, timeoutSeconds
            patch         PATCH /api/v1/namespaces/<ns>/pods/<name>, application/merge-patch+json
    events  create        POST /api/v1/namespaces/<ns>/events (core/v1)
    nodes   list, watch   GET /api/v1/nodes (fieldSelector metadata.name=<node>, or a labelSelector)
            patch         PATCH /api/v1/nodes/<name> (labels only)
    modelpreheats list, watch; status get, patch   /apis/weightswarm.io/v1alpha1/modelpreheats[/<name>/status]

A 403 from any of these is logged by the caller with the verb and resource, so the chart can be fixed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from agent.core.errors import ConfigError, snippet
from agent.core.settings import KubeSettings
from agent.kube.api import GROUP, PLURAL, VERSION, ApiError, Kind, Query

_MERGE = "application/merge-patch+json"


def make_api_client(settings: KubeSettings) -> Any:
    """A kubernetes ApiClient: the given kubeconfig, else in-cluster, else ~/.kube/config."""
    try:
        if settings.kubeconfig is not None:
            return config.new_client_from_config(config_file=str(settings.kubeconfig))  # type: ignore[no-untyped-call]
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        except config.ConfigException:
            return config.new_client_from_config()  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - missing file, bad YAML, bad keys: all one actionable line
        raise ConfigError(
            f"cannot configure the Kubernetes client ({snippet(str(exc), 150)}); "
            "run in a pod with a service account or pass --kubeconfig"
        ) from exc


def _refused(exc: ApiException) -> NoReturn:
    """An ApiException as the port's ApiError: the Status object's message, else the body cut short."""
    message = ""
    try:
        message = str(json.loads(exc.body or "{}").get("message", ""))
    except (ValueError, AttributeError):
        message = snippet(exc.body, 120)
    raise ApiError(exc.status, exc.reason or "", message) from exc


class _RawWatch(watch.Watch):
    """`Watch` that hands events over as plain dicts: we read only metadata, annotations and phase,
    and skipping model deserialisation keeps a busy node cheap. ERROR events (410) still raise."""

    def get_return_type(self, func: Any) -> None:
        return None


class _Watch:
    """One watch request (agent.kube.api.Watch); the request is sent when iteration starts."""

    def __init__(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self._w = _RawWatch()  # type: ignore[no-untyped-call]
        self._func = func
        self._kwargs = kwargs

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        try:
            events: Iterator[dict[str, Any]] = self._w.stream(self._func, **self._kwargs)  # type: ignore[no-untyped-call]
            for event in events:
                obj = event.get("raw_object") or event.get("object") or {}
                yield {"type": event.get("type"), "object": obj}
        except ApiException as exc:
            _refused(exc)
        finally:
            self._w.stop()  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        # A watch blocks in a socket read for up to its timeout: Watch.stop shuts the socket down.
        self._w.stop()  # type: ignore[no-untyped-call]


class KubernetesApi:
    """agent.kube.api.KubeApi over a kubernetes ApiClient (`api_client`, else `make_api_client`)."""

    def __init__(self, settings: KubeSettings, api_client: Any | None = None) -> None:
        self._settings = settings
        self._own = api_client is None
        self._client = make_api_client(settings) if api_client is None else api_client
        self._core = client.CoreV1Api(self._client)
        self._custom = client.CustomObjectsApi(self._client)

    def _list_call(self, query: Query) -> tuple[Callable[..., Any], dict[str, Any]]:
        selectors = {"field_selector": query.field_selector, "label_selector": query.label_selector}
        selectors = {k: v for k, v in selectors.items() if v}
        if query.kind == "pods":
            if query.namespace is not None:
                return self._core.list_namespaced_pod, {"namespace": query.namespace, **selectors}
            return self._core.list_pod_for_all_namespaces, selectors
        if query.kind == "nodes":
            return self._core.list_node, selectors
        return self._custom.list_cluster_custom_object, {
            "group": GROUP, "version": VERSION, "plural": PLURAL, **selectors
        }

    def list(self, query: Query) -> tuple[list[dict[str, Any]], str | None]:
        func, kwargs = self._list_call(query)
        try:
            resp = func(**kwargs, _preload_content=False, _request_timeout=self._settings.request_timeout)
        except ApiException as exc:
            _refused(exc)
        data = _json(resp)
        rv = str(data.get("metadata", {}).get("resourceVersion") or "") or None
        return list(data.get("items") or []), rv

    def watch(self, query: Query, resource_version: str | None, timeout: int) -> _Watch:
        func, kwargs = self._list_call(query)
        kwargs.update(
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            # The server ends the watch after timeout_seconds; the read timeout is only for a
            # connection that died silently.
            _request_timeout=(self._settings.request_timeout, timeout + self._settings.request_timeout),
        )
        if resource_version:
            kwargs["resource_version"] = resource_version
        return _Watch(func, kwargs)

    def get(self, kind: Kind, name: str, subresource: str | None = None) -> dict[str, Any]:
        if kind != "modelpreheats" or subresource != "status":
            raise ValueError(f"the agent reads no {kind} {subresource or ''} by name")
        try:
            return _as_dict(self._custom.get_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, _request_timeout=self._settings.request_timeout
            ))
        except ApiException as exc:
            _refused(exc)

    def patch(
        self, kind: Kind, name: str, body: Mapping[str, Any], namespace: str | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        body = dict(body)
        timeout = self._settings.request_timeout
        options: dict[str, Any] = {"_content_type": _MERGE, "_request_timeout": timeout}
        try:
            # Pods and nodes as JSON, not models: the same dict as every other answer of the port.
            if kind == "pods" and namespace is not None and subresource is None:
                return _json(self._core.patch_namespaced_pod(
                    name, namespace, body, _preload_content=False, **options
                ))
            if kind == "nodes" and subresource is None:
                return _json(self._core.patch_node(name, body, _preload_content=False, **options))
            if kind == "modelpreheats" and subresource == "status":
                return _as_dict(self._custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, PLURAL, name, body, **options
                ))
        except ApiException as exc:
            _refused(exc)
        raise ValueError(f"the agent patches no {kind} {subresource or ''}")

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        body = client.CoreV1Event.from_dict(dict(event))
        assert body is not None
        try:
            self._core.create_namespaced_event(
                namespace, body, _request_timeout=self._settings.request_timeout
            )
        except ApiException as exc:
            _refused(exc)

    def close(self) -> None:
        """Release the ApiClient if this adapter made it."""
        if self._own:
            self._client.close()


def _as_dict(obj: object) -> dict[str, Any]:
    """An object as the client returns it (a plain dict for custom objects; typed `object`)."""
    if not isinstance(obj, dict):
        raise TypeError(f"expected a JSON object from the API server, got {type(obj).__name__}")
    return obj


def _json(resp: Any) -> dict[str, Any]:
    """The JSON body of an answer asked for with `_preload_content=False`; the connection goes back."""
    try:
        return _as_dict(json.loads(resp.data))
    finally:
        resp.release_conn()
