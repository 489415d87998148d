"""Whether a generating request ends with the token it just sampled: its
grammar completes (or is broken), an end-of-sequence or stop token after
``min_tokens``, ``max_tokens`` or the model's length. Stop strings are the
output processor's (they need text)."""

from __future__ import annotations

import logging

from octavo.core.request import Request, RequestStatus

logger = logging.getLogger(__name__)


def check_stop(request: Request, max_model_len: int) -> bool:
    """After a token was appended: whether ``request`` ends here (its status set if so)."""
    # Runs for every sampled token: lengths read once, no properties.
    output_token_ids = request.output_token_ids
    last_token_id = output_token_ids[-1]
    if request.grammar is not None and grammar_ends(request, last_token_id):
        return True
    params = request.sampling_params
    num_output_tokens = len(output_token_ids)
    if num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and last_token_id in request.eos_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last_token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
    if num_output_tokens >= request.max_tokens or len(request.all_token_ids) >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def grammar_ends(request: Request, token_id: int) -> bool:
    """Advance the request's grammar; True once it is complete (or broken)."""
    if not request.grammar.accept(token_id):
        # Cannot happen when the mask was applied; never continue off the grammar.
        logger.error("request %s: token %d is outside its grammar", request.request_id, token_id)
        request.status = RequestStatus.FINISHED_ERROR
        return True
    if request.grammar.is_terminated:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    return False
