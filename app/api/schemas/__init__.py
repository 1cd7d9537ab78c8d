"""Request and response bodies, by resource (app/api/schemas/common.py says how)."""

from app.api.schemas.common import Error, Links, parse
from app.api.schemas.jobs import (
    DeadJobs,
    Deleted,
    DlqForm,
    Job,
    NextStateBody,
    QueuedJobs,
    Requeued,
)
from app.api.schemas.management import (
    Consumer,
    ConsumerForm,
    PauseForm,
    Stakeholder,
    StakeholderForm,
)
from app.api.schemas.messages import Message, MessagesStatus, ScheduledLinks, ScheduledMessage
from app.api.schemas.pull import (
    AckBody,
    AckFields,
    AckItem,
    AckResults,
    AcksBody,
    ConsumerInfo,
    Lease,
    PullBody,
    Pulled,
    StreamLine,
    UnpinBody,
    Unpinned,
)
from app.api.schemas.redrives import Redrive, RedriveBody, Redrives
from app.api.schemas.status import DlqStatus, JobStatus, Ready, Status

__all__ = [
    "AckBody",
    "AckFields",
    "AckItem",
    "AckResults",
    "AcksBody",
    "Consumer",
    "ConsumerForm",
    "ConsumerInfo",
    "DeadJobs",
    "Deleted",
    "DlqForm",
    "DlqStatus",
    "Error",
    "Job",
    "JobStatus",
    "Lease",
    "Links",
    "Message",
    "MessagesStatus",
    "NextStateBody",
    "PauseForm",
    "PullBody",
    "Pulled",
    "QueuedJobs",
    "Ready",
    "Redrive",
    "RedriveBody",
    "Redrives",
    "Requeued",
    "ScheduledLinks",
    "ScheduledMessage",
    "Stakeholder",
    "StakeholderForm",
    "Status",
    "StreamLine",
    "UnpinBody",
    "Unpinned",
    "parse",
]
