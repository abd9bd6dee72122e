"""splitserve.bench: a load generator and report for any OpenAI-compatible endpoint.

Pure parts (no network): `workload` (seeded prompts and arrivals), `multi_turn` (seeded
multi-tenant conversations whose turns resend the history), `sse` (stream decoding),
`stats` (percentiles, SLO attainment, goodput), `report` (JSON and text), `plots` (PNG).
The async client (`client`) sends the workload (`multi_turn_replay`: conversations, closed loop
per user); `runner` ties them together; `cli` is the
`splitserve bench` command. Import the submodules directly: this package imports nothing heavy.
"""
