"""POST /v1/rerank behind the route: many candidates through the windowed tournament of
``app.method.tournament`` (design §2.10), every window of a round in one batch of forward
passes, each window debiased with the profile of its own N.

The stages of every request: decode (the model, counts and top_n, the fields sent that
change nothing (counted and logged), the query, the documents in any accepted shape to
their encoded bytes with every header checked, the echo of what was sent) -> plan (the
window, the tournament's rule and rounds' window sizes and their forward passes, the labels
of every window size resolved once each, the profile of every size or the fallback) -> run
(round by round: a round's windows in batches of LAD_MAX_BATCH_SIZE windows, each batch's
images decoded while the batch before runs, each window debiased to advance its best) ->
debias (the tournament's ranking and relevance) -> encode.

Memory does not grow with the documents beyond their bytes as received (the body, charged
to the byte budget): the pixels of at most two batches of windows are held at once, one
running and one decoding, and a document that plays again in a later round is decoded
again (the encoder cache keeps the vision tower from encoding it twice).

One document is decoded (so a bad one is refused as any other) and answered without a
forward pass: it is the only candidate, so its rank is 1 and its relevance_score 1.0, the
probability any method gives the only label (a restricted softmax over one label is 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool

from app import errors
from app.method.methods import NEEDS_CALIBRATION, passes
from app.method.tournament import Tournament, choose_rule, window_sizes
from app.observability import logs
from app.observability.request_context import REQUEST_ID
from app.service.decode import ImageInput
from app.service.decode.decoder import EncodedImage
from app.service.pipeline import (
    DEBIAS,
    DECODE,
    ENCODE,
    PLAN,
    RUN,
    Context,
    Handler,
    ms_since,
    stage,
)
from lad_client.types import (
    RerankBilledUnits,
    RerankMeta,
    RerankOptions,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    SentDocument,
)
from lad_client.types.documents import as_sent
from lad_client.vocabulary import IGNORED_RERANK_FIELDS

_EMBEDDED_IMAGE = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,", re.ASCII)
_METADATA_LINE = re.compile(r"[^\n:]{1,200}: ")


def _text_around_image(document: ImageInput, k: int) -> None:
    """Refuse, with the fix, a string document that holds text before its data URL (what
    LlamaIndex's rerankers send by default: the node's metadata lines, a blank line, then
    its text), instead of the decoder's "not valid base64"."""
    if not isinstance(document, str):
        return
    found = _EMBEDDED_IMAGE.search(document, 0, 64 * 1024)
    if found is None or found.start() == 0 or not document[: found.start()].strip():
        return
    head = document[: found.start()]
    if head.endswith("\n\n") and _METADATA_LINE.match(head):
        raise errors.InvalidImage(
            f"documents[{k}] is text with the image after it ('<key>: <value>' lines, a blank "
            "line, then a data URL): LlamaIndex writes a node's metadata before its text "
            "(MetadataMode.EMBED), and CohereRerank and JinaRerank send that text. The service "
            "ranks images only: exclude the metadata from the embed text, e.g. "
            "node.excluded_embed_metadata_keys = list(node.metadata) for every node (or build "
            "the nodes with excluded_embed_metadata_keys set), so that each document is the "
            "data URL alone"
        )
    raise errors.InvalidImage(
        f"documents[{k}] holds text before its data:image/...;base64, URL; the service ranks "
        "images only: send the data URL (or bare base64) alone"
    )


class _PromptTokens:
    """The prompt tokens of every forward pass, summed (None once a pass reports none)."""

    def __init__(self) -> None:
        self.total: int | None = 0

    def add(self, counts: Iterable[int | None]) -> None:
        for count in counts:
            self.total = None if self.total is None or count is None else self.total + count


@dataclass
class RerankContext(Context):
    """One rerank: the request, the documents, the tournament and what it cost."""

    options: RerankOptions | None = None
    query: str = ""
    inputs: Sequence[ImageInput] = ()  # decode: the documents' images as sent
    encoded: list[EncodedImage] = field(default_factory=list)  # decode: their checked bytes
    sent: list[SentDocument] | None = None  # decode: the echo (return_documents)
    ignored: Sequence[str] = ()  # the fields sent that change nothing
    top_n: int = 1
    window: int = 0  # plan
    rule: str = "runners_up"  # plan: how many of a window advance (choose_rule)
    rounds: list[list[int]] | None = None  # plan: the window sizes of every round
    tournament: Tournament | None = None  # run
    seed: int = 0
    spent: int = 0  # run: forward passes
    tokens: _PromptTokens | None = None
    scores: np.ndarray | None = None  # debias: relevance per document
    ranking: list[int] | None = None

    @property
    def n(self) -> int:
        return len(self.inputs)


class Rerank(Handler):
    """The rerank feature: decode, plan, run (the rounds), debias (the ranking), encode."""

    async def __call__(
        self, options: RerankOptions, query: str, documents: Sequence[ImageInput]
    ) -> RerankResponse:
        """``options``: the JSON body (documents in any accepted shape) or a form's options
        with ``documents`` its file parts."""
        ctx = RerankContext(method=options.method, options=options, query=query)
        if isinstance(options, RerankRequest):
            ctx.inputs = options.images()
            ctx.sent = options.sent() if options.return_documents else None
            ctx.ignored = options.ignored()
        else:
            ctx.inputs = documents
            if options.return_documents:  # a form's file parts (bytes) echo in base64
                ctx.sent = [as_sent(d) for d in documents]
        try:
            with stage(ctx, DECODE):
                await self.decode(ctx)
            with stage(ctx, PLAN):
                await self.plan(ctx)
            with stage(ctx, RUN):
                await self.run(ctx)
            with stage(ctx, DEBIAS):
                self.debias(ctx)
            with stage(ctx, ENCODE):
                response = self.encode(ctx)
        finally:  # the bytes fetched by URL leave the budget with the request
            self.pipeline.release(ctx)
        response.meta.timings_ms.update(self.pipeline.finish(ctx))
        return response

    def _options(self, ctx: RerankContext) -> RerankOptions:
        assert ctx.options is not None
        return ctx.options

    # -------------------------------------------------------------------- decode
    async def decode(self, ctx: RerankContext) -> None:
        options, pipeline, n = self._options(ctx), self.pipeline, ctx.n
        model = options.model
        if model is not None and model != pipeline.model_id:  # as vLLM answers another id
            raise errors.ModelNotFound(
                f"model {model[:200]!r} is not served here; this service serves "
                f"{pipeline.model_id!r} (GET /v1/models)"
            )
        logs.note(method=options.method, n=n, profile=options.profile)
        self._ignore(ctx.ignored)
        limit = pipeline.settings.max_rerank_candidates
        if n < 1:
            raise errors.TooFewImages("documents is empty; send at least one image")
        if n > limit:
            raise errors.TooManyImages(
                f"documents has {n} images; the limit is LAD_MAX_RERANK_CANDIDATES={limit}"
            )
        ctx.top_n = min(options.top_n or 1, n)  # how many advance; more than n: clipped
        pipeline.decoder.query(ctx.query)
        for k, document in enumerate(ctx.inputs):
            _text_around_image(document, k)
        body_limit = ("LAD_MAX_BODY_BYTES", pipeline.settings.max_body_bytes)
        [ctx.inputs] = await pipeline.fetch(ctx, [("documents", ctx.inputs)], body_limit)
        async with pipeline.decoder.slot():  # every header checked; pixels when a round runs
            ctx.encoded = await run_in_threadpool(
                pipeline.decoder.encoded, ctx.inputs, "documents", ctx.timings
            )

    def _ignore(self, fields: Sequence[str]) -> None:
        """Count the ignored fields (by name when well known, else "other") and name them,
        escaped, in the request's log line."""
        if not fields:
            return
        counter = self.pipeline.metrics.rerank_ignored_fields
        for name in fields:
            counter.labels(field=name if name in IGNORED_RERANK_FIELDS else "other").inc()
        logs.note(ignored_fields=logs.escaped_names(fields))

    # -------------------------------------------------------------------- plan
    def _default_window(self, options: RerankOptions) -> int:
        """A method that reads no profile (vanilla, attn_raw, perm_avg) uses windows of
        LAD_MAX_IMAGES whatever is calibrated; one that does, the largest N the profile has
        (LAD_MAX_IMAGES when it has none: the request is then refused or falls back)."""
        most = self.pipeline.settings.max_images
        if options.method not in NEEDS_CALIBRATION:
            return most
        sizes = self.pipeline.profiles.sizes(options.profile, options.labels)
        calibrated = [k for k in sizes if k <= most]
        return calibrated[-1] if calibrated else most

    def _plan(self, ctx: RerankContext) -> None:
        """Off the event loop: the window (default: ``_default_window``), the rounds'
        window sizes, the labels of each size (resolved once) and the profiles of every
        size (or 409)."""
        options, pipeline, n = self._options(ctx), self.pipeline, ctx.n
        window = options.window or self._default_window(options)
        rule = choose_rule(n, min(window, n), ctx.top_n)
        rounds = window_sizes(n, min(window, n), ctx.top_n, rule)
        needed = sorted({s for r in rounds for s in r})
        planned = sum(passes(options.method, s) for r in rounds for s in r)
        if planned > pipeline.settings.max_rerank_passes:
            raise errors.InvalidRequest(
                f"this tournament ({n} documents, window {window}, top_n {ctx.top_n}, method "
                f"{options.method}) would take {planned} forward passes; the limit is "
                f"LAD_MAX_RERANK_PASSES={pipeline.settings.max_rerank_passes}: lower top_n, "
                "use a larger window or another method"
            )
        at_once = min(n, self._batch_windows() * max(needed))  # a batch's images decode together
        largest = sum(sorted((e.pixels for e in ctx.encoded), reverse=True)[:at_once])
        if largest > pipeline.settings.max_request_pixels:
            raise errors.ImageTooLarge(
                f"the documents' {at_once} largest images, one batch of windows decoded at once, "
                f"would decode to {largest} pixels; the limit is LAD_MAX_REQUEST_PIXELS="
                f"{pipeline.settings.max_request_pixels}: send smaller images or a smaller window"
            )
        ctx.labels = {size: pipeline.labels(size, options.labels, "window") for size in needed}
        logs.note(labels=options.labels)  # once valid: a refused value is never logged

        def refuse(missing: list[int]) -> errors.ServiceError:
            return errors.CalibrationRequired(
                f"the tournament of {n} documents with window {window} uses windows of N = "
                f"{needed}; profile {options.profile!r} (labels {options.labels}) has no "
                f'calibration for N = {missing}: POST /v1/calibrate with "n": "all" and '
                f"examples of at least {max(needed)} images, or rerank with method "
                '"vanilla" or "perm_avg"'
            )

        plan = pipeline.plan(options.method, options.profile, list(ctx.labels.values()), refuse)
        pipeline.adopt(ctx, plan)
        ctx.window, ctx.rule, ctx.rounds = window, rule, rounds

    async def plan(self, ctx: RerankContext) -> None:
        if ctx.n == 1:  # the only candidate: nothing to plan, no profile read
            ctx.window, ctx.rounds = 1, []
            return
        await run_in_threadpool(self._plan, ctx)
        if ctx.fallback_for is not None:  # the operator's fallback (LAD_FALLBACK_TO_VANILLA)
            logs.note(method=ctx.method, fallback=True)

    # -------------------------------------------------------------------- run
    def _batch_windows(self) -> int:
        """Windows decoded and submitted together: one batch's worth (LAD_MAX_BATCH_SIZE)."""
        return self.pipeline.settings.max_batch_size

    async def run(self, ctx: RerankContext) -> None:
        """Round by round, a round's windows in batches: each batch's images decoded (the
        next batch's while this one runs), its windows through the queue together, each
        debiased with its N's profile so that its best advance (their debias time counted
        as debias)."""
        options = self._options(ctx)
        ctx.seed = options.seed if options.seed is not None else secrets.randbits(32)
        ctx.tokens = _PromptTokens()
        if ctx.n == 1:  # no forward pass: the only candidate ranks first
            return
        ctx.tournament = tournament = Tournament(
            ctx.n, min(ctx.window, ctx.n), ctx.top_n, ctx.seed, ctx.rule
        )
        size = self._batch_windows()
        while (windows := tournament.next_round()) is not None:
            batches = [windows[i : i + size] for i in range(0, len(windows), size)]
            bulk = (
                sum(passes(ctx.method, len(w)) for w in windows) > self.pipeline.settings.max_queue
            )
            probabilities: list[Sequence[float]] = []
            decoding = self._decode_soon(ctx, batches[0])
            try:
                for i, batch in enumerate(batches):
                    images = await decoding
                    if i + 1 < len(batches):  # the next batch decodes while this one runs
                        decoding = self._decode_soon(ctx, batches[i + 1])
                    probabilities += await self._windows(ctx, batch, images, bulk)
                    del images
            finally:
                if not decoding.done():
                    decoding.cancel()
                with contextlib.suppress(BaseException):
                    await decoding
            tournament.record(probabilities)

    def _decode_soon(
        self, ctx: RerankContext, batch: list[list[int]]
    ) -> asyncio.Future[dict[int, Image.Image]]:
        return asyncio.ensure_future(self._decode_batch(ctx, [i for w in batch for i in w]))

    async def _decode_batch(self, ctx: RerankContext, indices: list[int]) -> dict[int, Image.Image]:
        """The documents' images of one batch of windows, decoded now (timed as decode)."""
        decoder = self.pipeline.decoder
        async with decoder.slot():
            started = time.perf_counter()
            images = await run_in_threadpool(
                decoder.decode, [ctx.encoded[i] for i in indices], "documents"
            )
            ctx.add("decode", ms_since(started))
        return dict(zip(indices, images, strict=True))

    async def _windows(
        self,
        ctx: RerankContext,
        batch: list[list[int]],
        images: dict[int, Image.Image],
        bulk: bool,
    ) -> list[Sequence[float]]:
        """One batch of windows through the queue; each window's debiased probabilities."""
        pipeline, method = self.pipeline, ctx.method
        assert ctx.tokens is not None
        works = [
            work
            for w in batch
            for work in pipeline.works(
                ctx.query, [images[i] for i in w], ctx.labels[len(w)], passes(method, len(w))
            )
        ]
        results = await pipeline.forward(ctx, works, bulk=bulk)
        ctx.spent += len(works)
        ctx.tokens.add(r.prompt_tokens for r in results)
        started = time.perf_counter()
        probabilities, at = [], 0
        for w in batch:
            k = passes(method, len(w))
            mine, at = results[at : at + k], at + k
            out = pipeline.debias(method, mine, ctx.calibrations.get(len(w)))
            probabilities.append(out.probabilities)
        ctx.add("debias", ms_since(started))
        return probabilities

    def debias(self, ctx: RerankContext) -> None:
        """The tournament's ranking and relevance across windows."""
        if ctx.n == 1:
            ctx.scores, ctx.ranking = np.ones(1), [0]
            return
        assert ctx.tournament is not None
        ctx.scores = ctx.tournament.relevance()
        ctx.ranking = ctx.tournament.ranking()

    # -------------------------------------------------------------------- encode
    def encode(self, ctx: RerankContext) -> RerankResponse:
        assert ctx.scores is not None and ctx.ranking is not None
        assert ctx.tokens is not None and ctx.rounds is not None
        options, pipeline, n, scores = self._options(ctx), self.pipeline, ctx.n, ctx.scores
        results = [
            RerankResult(
                index=i,
                relevance_score=float(scores[i]),
                document=None if ctx.sent is None else ctx.sent[i],
            )
            for i in ctx.ranking[: min(options.top_n or n, n)]
        ]
        rounds = 0 if ctx.tournament is None else ctx.tournament.rounds_played
        tokens = ctx.tokens.total
        profiles = ctx.profiles
        meta = RerankMeta(
            method=ctx.method,
            model=pipeline.model_id,
            profile={str(size): p.version for size, p in sorted(profiles.items())} or None,
            window=min(ctx.window, n),
            seed=ctx.seed,
            rounds=rounds,
            windows=ctx.rounds,
            forward_passes=ctx.spent,
            billed_units=RerankBilledUnits(images=n, input_tokens=tokens),
            timings_ms={},
        )
        request_id = REQUEST_ID.get() or secrets.token_hex(16)
        return RerankResponse(
            id=f"rerank-{request_id}",
            model=pipeline.model_id,
            usage=RerankUsage(
                images=n, prompt_tokens=tokens, total_tokens=tokens, forward_passes=ctx.spent
            ),
            results=results,
            meta=meta,
        )
