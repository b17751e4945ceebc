"""Translating with a trained Seq2SeqTransformer: greedy decoding and beam search.

The decoder is re-run over the whole prefix at every step (no incremental state): simple, and
on the models this tool trains the decoding of a validation set stays a few seconds.
Both return, per source sentence, the output token ids without BOS and EOS.
"""

from __future__ import annotations

from typing import List, Union

import torch
import torch.nn.functional as F

Limits = Union[int, torch.Tensor]  # one output length limit for every sentence, or one each (B,)


def max_output_len(src_len, max_positions: int, a: float = 1.2, b: int = 10):
    """Output length limit for a source of src_len tokens (EOS included), fairseq's
    max_len_a * src_len + max_len_b (`task.max_len_a`, `task.max_len_b`), within the positions.
    src_len: an int, or a tensor of one length per sentence (then a tensor of limits)."""
    if isinstance(src_len, torch.Tensor):
        return (src_len.double() * a).long().add(b).clamp(max=max_positions - 1)  # float64, as int(a * s)
    return min(int(a * src_len) + b, max_positions - 1)


def _per_sentence(limits: Limits, n: int, device) -> torch.Tensor:
    return torch.as_tensor(limits, dtype=torch.long, device=device).expand(n)


def _strip(row: List[int], eos: int, pad: int) -> List[int]:
    """The tokens before the first EOS, or before the padding that follows a sentence stopped
    at its limit (neither is ever output as a token)."""
    ends = [row.index(t) for t in (eos, pad) if t in row]
    return row[:min(ends)] if ends else row


def _next_token_scores(model, tokens, memory, memory_mask, bos: int, pad: int) -> torch.Tensor:
    """Log-probabilities of the next token after `tokens`; BOS and padding are never output
    (label smoothing gives them some mass; fairseq rules them out the same way)."""
    logp = F.log_softmax(model.logits(model.decode(tokens, memory, memory_mask)[:, -1]).float(), -1)
    logp[:, [bos, pad]] = float("-inf")
    return logp


@torch.no_grad()
def greedy(model, src: torch.Tensor, bos: int, eos: int, pad: int, max_len: Limits) -> List[List[int]]:
    """The most likely next token at each step, up to max_len tokens (per sentence when
    max_len is a tensor: a sentence that reaches its limit stops there, the others go on)."""
    memory, memory_mask = model.encode(src), model.key_mask(src)
    tokens = torch.full((src.shape[0], 1), bos, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    limits = _per_sentence(max_len, src.shape[0], src.device)
    for t in range(1, int(limits.max()) + 1):
        step = _next_token_scores(model, tokens, memory, memory_mask, bos, pad).argmax(-1)
        step = step.masked_fill(done, pad)
        tokens = torch.cat([tokens, step[:, None]], dim=1)
        done |= (step == eos) | (limits <= t)
        if bool(done.all()):
            break
    return [_strip(row[1:], eos, pad) for row in tokens.tolist()]


@torch.no_grad()
def beam_search(model, src: torch.Tensor, bos: int, eos: int, pad: int, max_len: Limits,
                beam: int) -> List[List[int]]:
    """Beam search with scores normalised by length (fairseq's default, lenpen 1): a sentence
    is done when `beam` hypotheses have ended; the best of them by mean log-probability wins.
    A hypothesis ends at max_len tokens at the latest (per sentence when it is a tensor)."""
    B, device = src.shape[0], src.device
    limits = _per_sentence(max_len, B, device)
    last = int(limits.max())
    memory = model.encode(src).repeat_interleave(beam, 0)
    memory_mask = model.key_mask(src)
    if memory_mask is not None:
        memory_mask = memory_mask.repeat_interleave(beam, 0)
    tokens = torch.full((B * beam, 1), bos, dtype=torch.long, device=device)
    scores = torch.full((B, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0  # every beam starts as the same BOS: keep one
    finished: List[List] = [[] for _ in range(B)]
    for t in range(1, last + 2):
        logp = _next_token_scores(model, tokens, memory, memory_mask, bos, pad)
        at_limit = (limits + 1 == t).repeat_interleave(beam)  # max_len tokens, as greedy's limit
        if bool(at_limit.any()):  # ... so those sentences' hypotheses end here
            only_eos = torch.full_like(logp[at_limit], float("-inf"))
            only_eos[:, eos] = 0.0
            logp[at_limit] = logp[at_limit] + only_eos
        V = logp.shape[-1]
        candidates = (scores.view(-1, 1) + logp).view(B, beam * V)
        top_scores, top_index = candidates.topk(2 * beam, dim=1)
        top_scores, top_index = top_scores.tolist(), top_index.tolist()
        rows, next_tokens, next_scores = [], [], []
        for b in range(B):
            kept = 0
            for score, index in zip(top_scores[b], top_index[b]):
                origin, token = b * beam + index // V, index % V
                if len(finished[b]) >= beam or kept == beam:
                    break
                if token == eos:
                    if score > float("-inf"):
                        finished[b].append((score / t, tokens[origin, 1:].tolist()))
                    continue
                rows.append(origin)
                next_tokens.append(token)
                next_scores.append(score)
                kept += 1
            while kept < beam:  # a finished sentence (or too few candidates): pad with dead beams
                rows.append(b * beam)
                next_tokens.append(pad)
                next_scores.append(float("-inf"))
                kept += 1
        if all(len(f) >= beam for f in finished):
            break
        index = torch.tensor(rows, device=device)
        tokens = torch.cat([tokens[index], torch.tensor(next_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(next_scores, device=device).view(B, beam)
    return [_strip(max(f, key=lambda h: h[0])[1], eos, pad) if f else [] for f in finished]
