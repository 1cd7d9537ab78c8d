"""Deprecated: the client is its own distribution now, `webhook-broker-client`, imported as
`webhook_broker_client` (a worker whose own package is named `app` could not import this one).
This alias stays for one release; it will be removed in the next.
"""

import sys
import warnings

from webhook_broker_client import *  # noqa: F403
from webhook_broker_client import (
    __all__,  # noqa: F401
    acks,
    broker,
    consume,
    consumer,
    errors,
    http,
    jobs,
    pulls,
    sync,
)

warnings.warn(
    "app.client is deprecated and will be removed in the next release: install"
    " webhook-broker-client and import webhook_broker_client instead",
    DeprecationWarning,
    stacklevel=2,
)

# `from app.client.sync import SyncBroker` and the like keep working: each old submodule name
# is the new module itself (one object, so a patched attribute is seen by both names).
for _module in (acks, broker, consume, consumer, errors, http, jobs, pulls, sync):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module
