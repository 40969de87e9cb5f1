"""specroute's policies inside vLLM's speculative decoding (docs/usage.md, "Serve with vLLM").

vLLM drafts with the drafter and verifies with the verifier as it always does; the plugin (`plugin.py`,
registered under `vllm.general_plugins`) replaces only the step that decides which drafts to keep: the
policy's pi at each draft position, then speculative sampling toward pi (router/sampling.py), exactly as
specroute's own loop does with bonus_from="verifier". It is switched on by configuration (`settings.py`:
SPECROUTE_POLICY and SPECROUTE_ALPHA in the environment); without it vLLM behaves as if it were absent.
This is another engine's loop running specroute's policies, not a backend of specroute's loop.

- `settings.py`: the configuration, checked in one place (one line per problem, before vLLM starts work);
- `acceptance.py`: the accept/resample step on padded tensors, pure torch (tested without vLLM);
- `counts.py`: accepted, rejected and deferred drafts per request and in total, written to a JSON file;
- `plugin.py`: the vLLM hooks, the only module that patches vLLM;
- `served.py`: vLLM engines driven from inside a specroute command (eval's grid in vLLM, the demo's pricing).
"""
