"""Every (known tokens, drafts) an EAGLE-3 head or MTP layer proposes, the
newest token last: what a plain recomputation is checked against."""

from __future__ import annotations


def record_proposals(monkeypatch) -> list[tuple[list[int], list[int]]]:
    from octavo.runtime.eagle_proposer import EagleProposer

    proposals: list[tuple[list[int], list[int]]] = []
    propose = EagleProposer.propose

    def recording(self, output):
        propose(self, output)
        for request_id, drafts in output.draft_token_ids.items():
            known = list(self.runner.states[request_id].token_ids) + list(output.sampled_token_ids[request_id])
            proposals.append((known, drafts))

    monkeypatch.setattr(EagleProposer, "propose", recording)
    return proposals
