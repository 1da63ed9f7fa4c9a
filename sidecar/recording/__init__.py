"""The effect-recording layer, one for every protocol (SPEC §3).

The HTTP guard (:mod:`sidecar.proxy.guard`) and the PostgreSQL engine
(:mod:`sidecar.pgwire.exactly_once`) differ in how they forward and answer; what an
effect's *record* needs is the same for both and written once, here:

    binding   what the request acts for (task, attempt, generation)     bindings.Bindings
    fence     a stale or forged attempt is refused, and the refusal     Recorder.bind / admit
              kept in the audit trail (counted once)
    self-fence the lease's time left, at admission and before sending   Recorder.admit
    record    every store write retried within a bound, then 503        Recorder.durably
              store_unavailable (fail closed)
"""
