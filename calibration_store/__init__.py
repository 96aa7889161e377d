"""Calibration profiles (DESIGN §2.3) and their stores: memory, local file, Redis.

`open_store(url)` picks the backend; every backend implements `ProfileStore`.
"""

from calibration_store.base import (
    DEFAULT_KEEP_VERSIONS,
    NoPreviousVersion,
    ProfileNotFound,
    ProfileStore,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
)
from calibration_store.evidence import Evidence, FeedbackResult, FeedbackSnapshot, OnlineStore
from calibration_store.factory import open_online_store, open_store
from calibration_store.local import FileProfileStore, MemoryProfileStore
from calibration_store.profile import (
    CURRENT_SCHEMA_VERSION,
    Fingerprint,
    Profile,
    ProfileKey,
    UnknownSchemaVersion,
)

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "DEFAULT_KEEP_VERSIONS",
    "Evidence",
    "FeedbackResult",
    "FeedbackSnapshot",
    "FileProfileStore",
    "Fingerprint",
    "MemoryProfileStore",
    "NoPreviousVersion",
    "OnlineStore",
    "Profile",
    "ProfileKey",
    "ProfileNotFound",
    "ProfileStore",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "UnknownSchemaVersion",
    "open_online_store",
    "open_store",
]
