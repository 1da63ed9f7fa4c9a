"""What every part of the sidecar runs on: background tasks (:mod:`.aio`), time
(:mod:`.clock`), JSON logs (:mod:`.logs`), metrics (:mod:`.metrics`), named failpoints for
kill tests (:mod:`.failpoints`), problem+json bodies (:mod:`.problems`), TLS server
contexts (:mod:`.tls`) and a long-running process's cheaper start-up (:mod:`.startup`)."""
