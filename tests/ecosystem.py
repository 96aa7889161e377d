"""The stock retrieval components that reach a reranker, each driven against the service
with its own defaults (issue 39): given the service's base URL, a token and the served
model id, the rest is the library's default. Each driver returns the ranking the component
hands back to its caller, as 0-based indices into ``documents``.

``python -m tests.ecosystem`` starts a live service (demo model, a profile calibrated with
``"n": "all"``), runs every component in both scenarios (8 candidate images, 2) and prints
the matrix: which (component, scenario) pairs work, and the message of each failure. The
test suite runs the same drivers (tests/e2e/test_ecosystem.py).
"""

from __future__ import annotations

import base64
import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from lad_lab.demo.world import RetrievalExample, make_items

# Nothing leaves the machine: LiteLLM reads its bundled price map instead of fetching one at
# import, Haystack sends no usage telemetry.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")


def data_url(image: Image.Image) -> str:
    """A PNG data URL: documents as a vector index hands them over."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass(frozen=True)
class Service:
    """Where a component is pointed: the base URL, the bearer token, the served model id."""

    url: str
    token: str
    model: str


Driver = Callable[[Service, str, Sequence[str]], list[int]]
"""(service, query, documents) -> the component's ranking, as indices into documents."""


# ------------------------------------------------------------------------------ Cohere SDK
def cohere_client(service: Service, query: str, documents: Sequence[str]) -> list[int]:
    import cohere

    co = cohere.Client(api_key=service.token, base_url=service.url)
    answer = co.rerank(model=service.model, query=query, documents=list(documents))
    return [r.index for r in answer.results]


def cohere_client_v2(service: Service, query: str, documents: Sequence[str]) -> list[int]:
    import cohere

    co = cohere.ClientV2(api_key=service.token, base_url=service.url)
    answer = co.rerank(model=service.model, query=query, documents=list(documents))
    return [r.index for r in answer.results]


# ------------------------------------------------------------------------------ LangChain
def langchain_cohere(service: Service, query: str, documents: Sequence[str]) -> list[int]:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(
        model=service.model, cohere_api_key=service.token, base_url=service.url
    )  # top_n: its default, 3
    docs = [Document(page_content=d, metadata={"position": k}) for k, d in enumerate(documents)]
    return [d.metadata["position"] for d in reranker.compress_documents(docs, query)]


# ------------------------------------------------------------------------------ Haystack
def haystack_cohere(service: Service, query: str, documents: Sequence[str]) -> list[int]:
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.rankers.cohere import CohereRanker

    ranker = CohereRanker(
        model=service.model, api_key=Secret.from_token(service.token), api_base_url=service.url
    )  # top_k: its default, 10
    docs = [Document(content=d, meta={"position": k}) for k, d in enumerate(documents)]
    return [d.meta["position"] for d in ranker.run(query=query, documents=docs)["documents"]]


# ------------------------------------------------------------------------------ LiteLLM
def _litellm(provider: str) -> Driver:
    def drive(service: Service, query: str, documents: Sequence[str]) -> list[int]:
        import litellm

        answer = litellm.rerank(
            model=f"{provider}/{service.model}",
            query=query,
            documents=list(documents),
            api_base=service.url,
            api_key=service.token,
        )
        return [r["index"] for r in answer.results or []]

    drive.__name__ = f"litellm_{provider}"
    return drive


# ------------------------------------------------------------------------------ Infinity
def infinity(service: Service, query: str, documents: Sequence[str]) -> list[int]:
    from infinity_client import AuthenticatedClient
    from infinity_client.api.default import rerank
    from infinity_client.models import HTTPValidationError, RerankInput

    client = AuthenticatedClient(base_url=service.url, token=service.token)
    body = RerankInput(query=query, documents=list(documents), model=service.model)
    answer = rerank.sync(client=client, body=body)
    if isinstance(answer, HTTPValidationError):  # its typed 422: FastAPI's detail list
        raise RuntimeError("; ".join(d.msg for d in answer.detail))
    if answer is None:  # any other status, with the client's defaults
        raise RuntimeError("infinity_client returned nothing (a status other than 200, 422)")
    return [r.index for r in answer.results]


# ------------------------------------------------------------------------------ LlamaIndex
LLAMA_METADATA = {"file_name": "candidate.png", "file_path": "/data/images/candidate.png"}
"""What LlamaIndex's readers put on a node (SimpleDirectoryReader), which its default
``MetadataMode.EMBED`` writes before the node's text."""


def _llama_nodes(documents: Sequence[str], metadata: bool) -> list[Any]:
    from llama_index.core.schema import NodeWithScore, TextNode

    nodes = []
    for k, d in enumerate(documents):
        meta = {**LLAMA_METADATA, "position": k}
        # with metadata=False, every key is excluded from the embed text (the documented
        # setting); "position" is ours, never sent
        excluded = list(meta) if not metadata else ["position"]
        node = TextNode(text=d, metadata=meta, excluded_embed_metadata_keys=excluded)
        nodes.append(NodeWithScore(node=node))
    return nodes


def _llama(kind: str, metadata: bool) -> Driver:
    def drive(service: Service, query: str, documents: Sequence[str]) -> list[int]:
        if kind == "cohere":
            from llama_index.postprocessor.cohere_rerank import CohereRerank

            post: Any = CohereRerank(
                model=service.model, api_key=service.token, base_url=service.url
            )  # top_n: its default, 2
        else:
            from llama_index.postprocessor.jinaai_rerank import JinaRerank

            post = JinaRerank(
                model=service.model, api_key=service.token, base_url=service.url + "/v1"
            )
        nodes = post.postprocess_nodes(_llama_nodes(documents, metadata), query_str=query)
        return [n.node.metadata["position"] for n in nodes]

    drive.__name__ = f"llamaindex_{kind}_{'metadata' if metadata else 'plain'}"
    return drive


# ------------------------------------------------------------------------------ rerankers
def _rerankers(provider: str) -> Driver:
    def drive(service: Service, query: str, documents: Sequence[str]) -> list[int]:
        from rerankers import Reranker

        ranker = Reranker(
            service.model,
            model_type=provider,
            api_key=service.token,
            url=f"{service.url}/v1/rerank",
            verbose=0,
        )
        ranked = ranker.rank(query=query, docs=list(documents))
        return [r.document.doc_id for r in ranked.results]

    drive.__name__ = f"rerankers_{provider}"
    return drive


COMPONENTS: dict[str, Driver] = {
    "cohere Client": cohere_client,
    "cohere ClientV2": cohere_client_v2,
    "LangChain CohereRerank": langchain_cohere,
    "Haystack CohereRanker": haystack_cohere,
    "LiteLLM hosted_vllm/": _litellm("hosted_vllm"),
    "LiteLLM cohere/": _litellm("cohere"),
    "LiteLLM jina_ai/": _litellm("jina_ai"),
    "infinity_client": infinity,
    "LlamaIndex CohereRerank, metadata excluded": _llama("cohere", metadata=False),
    "LlamaIndex JinaRerank, metadata excluded": _llama("jina", metadata=False),
    "LlamaIndex CohereRerank, default metadata": _llama("cohere", metadata=True),
    "LlamaIndex JinaRerank, default metadata": _llama("jina", metadata=True),
    "rerankers APIRanker cohere": _rerankers("cohere"),
    "rerankers APIRanker jina": _rerankers("jina"),
}
"""Every component of issue 39's matrix, by the name its table uses."""

DEFAULT_TOP: dict[str, int] = {
    "LangChain CohereRerank": 3,
    "Haystack CohereRanker": 10,
    "LlamaIndex CohereRerank, metadata excluded": 2,
    "LlamaIndex JinaRerank, metadata excluded": 2,
}
"""How many results a component asks for by default (top_n, top_k); the others ask for all."""

NEEDS_A_FIX: dict[str, str] = {
    "LlamaIndex CohereRerank, default metadata": "excluded_embed_metadata_keys",
    "LlamaIndex JinaRerank, default metadata": "excluded_embed_metadata_keys",
}
"""The components that cannot work with their defaults, and what the service's message tells
their user to change: LlamaIndex writes a node's metadata lines before its text, so the
document is not an image."""

SILENT_ERRORS: dict[str, str] = {
    "rerankers APIRanker cohere": "rerankers reads response['results'] whatever the status",
    "rerankers APIRanker jina": "rerankers reads response['results'] whatever the status",
}
"""Components whose error path shows no message of any server: KeyError('results')."""

SCENARIOS: dict[str, int] = {"8 images": 8, "2 images": 2}

SCENARIO_ITEMS: dict[int, int] = {8: 6, 2: 0}
"""Which evaluation item each scenario uses: one whose target the demo model ranks first in
every order of its candidates tried (140 window seeds for 8 images, both orders for 2), so
a test can assert the winner whatever order the service deals the window in."""


def scenario_item(n: int) -> RetrievalExample:
    """The query with ``n`` candidate images of the demo world (evaluation split) a scenario
    uses (``SCENARIO_ITEMS``)."""
    return make_items(8, n_candidates=n, setting="random", seed="eval", image_size=56)[
        SCENARIO_ITEMS[n]
    ]


def calibration_body(n: int = 8, examples: int = 5) -> dict[str, Any]:
    """POST /v1/calibrate with ``"n": "all"`` (docs/calibration.md): every N in 2..n."""
    items = make_items(
        examples, n_candidates=n, setting="random", seed="calibration", image_size=56
    )
    return {
        "profile": "default",
        "labels": "digits",
        "n": "all",
        "examples": [
            {"query": i.query, "images": [data_url(im) for im in i.images], "answer": i.target}
            for i in items
        ],
    }


def main() -> int:  # pragma: no cover - a probe for people
    import httpx

    from tests.live import LiveService

    token = "ecosystem-token"
    with LiveService(
        __import__("pathlib").Path(__import__("tempfile").mkdtemp(prefix="lad-eco-")),
        env={"LAD_RETRIEVE_TOKEN": token},
    ) as live:
        r = httpx.post(f"{live.url}/v1/calibrate", json=calibration_body(), timeout=600)
        r.raise_for_status()
        model = httpx.get(f"{live.url}/v1/models").json()["data"][0]["id"]
        service = Service(live.url, token, model)
        works = 0
        print(f"| component | {' | '.join(SCENARIOS)} |")
        print("|---|" + "---|" * len(SCENARIOS))
        for name, drive in COMPONENTS.items():
            cells = []
            for n in SCENARIOS.values():
                item = scenario_item(n)
                try:
                    ranking = drive(service, item.query, [data_url(im) for im in item.images])
                    cells.append(f"works {ranking}")
                    works += 1
                except Exception as exc:  # the component's own error, as its caller sees it
                    cells.append(f"{type(exc).__name__}: {str(exc)[:300]!r}")
            print(f"| {name} | {' | '.join(cells)} |", flush=True)
        print(f"\n{works} of {len(COMPONENTS) * len(SCENARIOS)} pairs work")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
