"""The wire schemas of the service (pydantic): what clients send and receive, by feature.

The service validates its requests and writes its answers with these same models, so the
client and the server cannot drift apart. Engine types never appear here.
"""

from lad_client.types.calibrate import (
    CALIBRATE_EXAMPLE,
    MAX_CALIBRATION_EXAMPLES,
    RECOMMENDED_CALIBRATION_EXAMPLES,
    CalibratedN,
    CalibrateRequest,
    CalibrateResponse,
    CalibrationExample,
)
from lad_client.types.common import (
    EXAMPLE_IMAGES,
    LABELS_DESCRIPTION,
    LABELS_JSON_SCHEMA,
    MAX_VERSION,
    ImageList,
    LabelsValue,
    Strict,
)
from lad_client.types.documents import (
    CohereDocument,
    ContentDocument,
    ContentDocuments,
    Document,
    ImageUrl,
    ImageUrlPart,
    JinaImageDocument,
    SentDocument,
)
from lad_client.types.errors import ErrorDetail, ErrorResponse
from lad_client.types.feedback import FeedbackRequest, FeedbackResponse, RefreshResponse
from lad_client.types.health import Health, Readiness
from lad_client.types.models import ModelCard, ModelList
from lad_client.types.profiles import (
    ProfileDeleted,
    ProfileEntry,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
    ProfileVersion,
)
from lad_client.types.rerank import (
    RERANK_EXAMPLE,
    RerankBilledUnits,
    RerankMeta,
    RerankOptions,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from lad_client.types.retrieve import (
    RETRIEVE_EXAMPLE,
    ProfileRef,
    RetrieveDetails,
    RetrieveOptions,
    RetrieveRequest,
    RetrieveResponse,
)
from lad_client.vocabulary import MAX_N, METHODS, NAME_PATTERN, SCHEMES, Method

__all__ = [
    "CALIBRATE_EXAMPLE",
    "EXAMPLE_IMAGES",
    "LABELS_DESCRIPTION",
    "LABELS_JSON_SCHEMA",
    "MAX_CALIBRATION_EXAMPLES",
    "MAX_N",
    "MAX_VERSION",
    "METHODS",
    "NAME_PATTERN",
    "RECOMMENDED_CALIBRATION_EXAMPLES",
    "RERANK_EXAMPLE",
    "RETRIEVE_EXAMPLE",
    "SCHEMES",
    "CalibrateRequest",
    "CalibrateResponse",
    "CalibratedN",
    "CalibrationExample",
    "CohereDocument",
    "ContentDocument",
    "ContentDocuments",
    "Document",
    "ErrorDetail",
    "ErrorResponse",
    "FeedbackRequest",
    "FeedbackResponse",
    "Health",
    "ImageList",
    "ImageUrl",
    "ImageUrlPart",
    "JinaImageDocument",
    "LabelsValue",
    "Method",
    "ModelCard",
    "ModelList",
    "ProfileDeleted",
    "ProfileEntry",
    "ProfileList",
    "ProfileRef",
    "ProfileRolledBack",
    "ProfileSummary",
    "ProfileVersion",
    "Readiness",
    "RefreshResponse",
    "RerankBilledUnits",
    "RerankMeta",
    "RerankOptions",
    "RerankRequest",
    "RerankResponse",
    "RerankResult",
    "RerankUsage",
    "RetrieveDetails",
    "RetrieveOptions",
    "RetrieveRequest",
    "RetrieveResponse",
    "SentDocument",
    "Strict",
]
