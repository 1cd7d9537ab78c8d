"""`python -m app.pipeline archive|report|all`: the same as `webhook-broker pipeline ...`."""

from app.pipeline.job import main

raise SystemExit(main())
