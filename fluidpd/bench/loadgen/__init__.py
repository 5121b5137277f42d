"""Open-loop load generator: replay a trace against a running server's streaming completions API.

Every request of the (rate-scaled, windowed) trace is sent at its own timestamp, whatever the
server is doing, with a prompt of exactly the trace's prompt length (token ids cut from the
shipped corpus, tokenized by the server's own /tokenize) and max_tokens = the trace's output
length with ignore_eos, so the server generates exactly that many tokens. The client records
the time to first token and every inter-token gap, and aggregates them the way the simulator
does (fluidpd.core.metrics.MetricsCollector), so the rows compare with `fluidpd simulate`.
"""
