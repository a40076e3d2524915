"""A KubeClient keeps at most its own number of connections open when given one, without
changing the configuration the operator's other clients are made from."""

from kubernetes_asyncio import client

from kiln_operator.k8s.client import DEFAULT_CONNECTIONS, KubeClient


def configuration() -> client.Configuration:
    made = client.Configuration()
    made.host = "https://127.0.0.1:6443"
    made.connection_pool_maxsize = DEFAULT_CONNECTIONS
    return made


def pool_limit(kube: KubeClient) -> int:
    connector = kube._api.rest_client.pool_manager.connector
    assert connector is not None
    limit: int = connector.limit
    return limit


async def test_a_client_given_fewer_connections_keeps_its_pool_that_small() -> None:
    shared = configuration()
    few = KubeClient(shared, connections=16)
    many = KubeClient(shared)
    try:
        assert pool_limit(few) == 16
        assert pool_limit(many) == DEFAULT_CONNECTIONS
        assert shared.connection_pool_maxsize == DEFAULT_CONNECTIONS
    finally:
        await few.close()
        await many.close()
