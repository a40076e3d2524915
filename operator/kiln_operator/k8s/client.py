"""A small JSON client for the Kubernetes API on top of kubernetes_asyncio's connection handling.

Why it exists: the reconcile loop works on plain dicts (what the builders produce and what the
API server returns), for every kind alike, including custom resources. kubernetes_asyncio
supplies kubeconfig / in-cluster auth and the connection pool; this adds get / create /
replace / delete / merge-patch returning dicts, and a user agent that names the operator.
"""

import copy
import json
import os
import time
from types import TracebackType
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from kiln_operator import constants, telemetry
from kiln_operator.builders.naming import Manifest
from kiln_operator.k8s.resources import Resource

APPLY_KINDS = {"inferenceservices": constants.KIND}
"""Kinds by plural, for the objects this client server-side-applies."""


REQUEST_TIMEOUT_SECONDS = 60.0
"""How long one request may take before it counts as unanswered (kopf's own API requests use
the same bound): without one, a half-open connection would hold a reconcile worker forever."""


class RequestFailed(Exception):
    """A request that did not succeed: refused or failed by the API server (ApiError), or never
    answered (NoAnswer)."""

    def __init__(self, method: str, message: str, answer: str) -> None:
        super().__init__(message)
        self.method = method
        """The HTTP method: which of read, create, update, patch, delete failed."""
        self.answer = answer
        """Why, trimmed for people: the API server's own message, or what came instead."""


class ApiError(RequestFailed):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(
            method, f"{method} {path}: HTTP {status}: {body[:500]}", _status_message(body)
        )
        self.status = status

    @property
    def is_rejection(self) -> bool:
        """400, 403, 422: the request itself was refused (invalid, forbidden, over a quota);
        sending it again unchanged gets the same answer."""
        return self.status in (400, 403, 422)

    @property
    def is_conflict(self) -> bool:
        """409: a stale resourceVersion, or the object already exists."""
        return self.status == 409

    @property
    def is_not_found(self) -> bool:
        """404."""
        return self.status == 404


class NoAnswer(RequestFailed):
    """No answer within REQUEST_TIMEOUT_SECONDS, or the connection failed."""

    def __init__(self, method: str, path: str, cause: Exception) -> None:
        answer = (
            f"no answer within {REQUEST_TIMEOUT_SECONDS:g} s"
            if isinstance(cause, TimeoutError)
            else f"connection failed: {_folded(str(cause) or type(cause).__name__)}"
        )
        super().__init__(method, f"{method} {path}: {answer}", answer)


MAX_ANSWER = 512
"""Characters of the API server's message kept for a condition: enough for the field, the
value and the rule it broke."""


def _status_message(body: str) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return _folded(str(message if message else body))


def _folded(text: str) -> str:
    """Whitespace folded, at most MAX_ANSWER characters."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_ANSWER else text[: MAX_ANSWER - 1] + "…"


async def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """The given kubeconfig; else the in-cluster service account when running in a pod; else
    $KUBECONFIG / ~/.kube/config."""
    configuration = client.Configuration()
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = DEFAULT_CONNECTIONS
    return configuration


DEFAULT_CONNECTIONS = 64
"""Connections a client keeps open to the API server at most (one request in flight each)."""


class KubeClient:
    """JSON in, JSON out. Use as `async with KubeClient(configuration) as kube:`."""

    def __init__(
        self,
        configuration: client.Configuration,
        component: str = "kiln",
        connections: int | None = None,
    ) -> None:
        """`connections`: this client's bound on open connections, if not the configuration's.
        Each open TLS connection holds a 256 KiB read buffer (asyncio's), so a client that
        needs few requests in flight should not keep many."""
        if connections is not None:
            configuration = copy.copy(configuration)
            configuration.connection_pool_maxsize = connections
        self._api = client.ApiClient(configuration)
        # kubernetes_asyncio's session trusts the environment, so aiohttp looks up proxy
        # variables and reads ~/.netrc on every request; the kubeconfig (or the in-cluster
        # configuration) already says how to reach the API server.
        self._api.rest_client.pool_manager._trust_env = False
        # The user agent names the component, so audit logs tell its writes from the others'.
        self._api.user_agent = f"{constants.MANAGER}/{component}"
        self._component = component

    async def __aenter__(self) -> "KubeClient":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the connection pool."""
        await self._api.close()

    async def _call(
        self,
        resource: Resource,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        collection: bool = False,
    ) -> Manifest:
        """One request; counted in the operator's metrics by resource, verb and status code."""
        verb = ("list" if collection else "get") if method == "GET" else telemetry.VERBS[method]
        started = time.perf_counter()
        try:
            response = await self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
            try:
                text = await response.text()
            finally:
                response.release()
        except (TimeoutError, aiohttp.ClientError) as error:
            self._count(resource, verb, "none", started)
            raise NoAnswer(method, path, error) from error
        self._count(resource, verb, str(response.status), started)
        if not 200 <= response.status < 300:
            raise ApiError(response.status, method, path, text)
        parsed: Manifest = json.loads(text) if text else {}
        return parsed

    def _count(self, resource: Resource, verb: str, code: str, started: float) -> None:
        seconds = time.perf_counter() - started
        telemetry.observe_api(self._component, resource.plural, verb, code, seconds)

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Manifest | None:
        """The object, or None when it does not exist."""
        try:
            return await self._call(resource, "GET", resource.path(namespace, name))
        except ApiError as error:
            if error.is_not_found:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str | None, label_selector: str | None = None
    ) -> list[Manifest]:
        """Every object of the collection (matching the selector)."""
        query = [("labelSelector", label_selector)] if label_selector else []
        answer = await self._call(
            resource, "GET", resource.path(namespace), query=query, collection=True
        )
        items: list[Manifest] = answer.get("items", [])
        return items

    async def create(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        """POST a new object."""
        return await self._call(
            resource,
            "POST",
            resource.path(namespace),
            body=body,
            query=[("fieldManager", constants.MANAGER)],
        )

    async def replace(self, resource: Resource, namespace: str | None, body: Manifest) -> Manifest:
        """PUT the whole object; its metadata.resourceVersion makes a stale write fail with 409."""
        return await self._call(
            resource,
            "PUT",
            resource.path(namespace, body["metadata"]["name"]),
            body=body,
            query=[("fieldManager", constants.MANAGER)],
        )

    async def delete(self, resource: Resource, namespace: str | None, name: str, uid: str) -> None:
        """DELETE one object, only if it is still the one we saw (uid precondition)."""
        try:
            await self._call(
                resource,
                "DELETE",
                resource.path(namespace, name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}},
            )
        except ApiError as error:
            if not error.is_not_found:
                raise

    async def merge_patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Manifest,
        subresource: str | None = None,
    ) -> Manifest:
        """JSON-merge-patch an object (or its `subresource`, e.g. "scale")."""
        path = resource.path(namespace, name) + (f"/{subresource}" if subresource else "")
        return await self._call(
            resource,
            "PATCH",
            path,
            body=patch,
            content_type="application/merge-patch+json",
            query=[("fieldManager", constants.MANAGER)],
        )

    async def strategic_patch_status(
        self, resource: Resource, namespace: str | None, name: str, patch: Manifest
    ) -> Manifest:
        """Strategic-merge-patch the status subresource of a built-in kind: lists with a merge
        key (a pod's conditions, by type) are merged, so other writers' entries stay."""
        return await self._call(
            resource,
            "PATCH",
            resource.path(namespace, name) + "/status",
            body=patch,
            content_type="application/strategic-merge-patch+json",
            query=[("fieldManager", constants.MANAGER)],
        )

    async def apply_status(
        self, resource: Resource, namespace: str | None, name: str, status: Manifest, manager: str
    ) -> Manifest:
        """Server-side apply of the status subresource as field manager `manager`: the server
        merges list-map entries (conditions, by type) of different managers instead of one
        writer's list replacing another's."""
        body = {
            "apiVersion": f"{resource.group}/{resource.version}" if resource.group else "v1",
            "kind": APPLY_KINDS[resource.plural],
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
            "status": status,
        }
        return await self._call(
            resource,
            "PATCH",
            resource.path(namespace, name) + "/status",
            body=body,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", manager), ("force", "true")],
        )
