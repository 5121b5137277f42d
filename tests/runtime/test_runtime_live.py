"""A runtime request's block hashes follow its answer: each filled block hashed once, chained on."""

from fluidpd.core.blockhash import block_hashes
from fluidpd.core.request import Request
from fluidpd.runtime.live import Live, extend_hashes


def test_answer_blocks_extend_the_prompts_hash_chain():
    prompt = list(range(100, 137))  # 2 full blocks of 16, 5 tokens over
    live = Live(Request(0, 0.0, len(prompt), 64), prompt, None, None)
    live.request.block_hashes = block_hashes(prompt, 16)
    seen = []
    for t in range(40):  # the answer arrives a token at a time
        live.out_ids.append(1000 + t)
        extend_hashes(live, 16)
        seen.append(len(live.request.block_hashes))
    assert live.request.block_hashes == block_hashes(prompt + live.out_ids, 16)
    assert seen[9] == 2 and seen[10] == 3 and seen[-1] == (37 + 40) // 16  # a block hashed when it fills
