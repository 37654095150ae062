"""Every command writes the very bytes it wrote before the house was rebuilt.

The digests below were made by ``tests/pinned_outputs.py`` with the code of commit
7562ed3, the last before the rebuild into layer packages (one engine, one plan, one
summary, storage handed down); the test makes them again with today's code. An
export's ``producer`` (the release) is left out of its digest. Changed on purpose since
(issue 28): a merge lays its sources' shards over one another (``merged``: two data files,
not three), and a plain safetensors export claims no ``"format"`` (``sharded``, ``st``).
"""

from __future__ import annotations

from pinned_outputs import write_all

PINNED = {
    "out/avg/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/avg/model.data-00000-of-00001": "b2470534f2d693ec8021dd481434deaf547689ebb4c766a8313918df9cbfd953",
    "out/avg/model.index": "dcd3a75d68a5a201c2ef1c9b2223e12c108a4e20f9e3cd24664994590050e2dc",
    "out/avg16/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/avg16/model.data-00000-of-00001": "f2af3927c1914fe9a1c34101ae4b2c8375b5f4920fb8c8e2375310552947d6d6",
    "out/avg16/model.index": "de7136415816ab644dc3eed3f436a6c8e969f1bbfe4fec910f6c879f211566d3",
    "out/back/model.data-00000-of-00001": "54093996cd7ed4ddb83fce0de6764f2a4fd4faf42fa88e2f09532f6d573c1a48",
    "out/back/model.index": "36e0936eadc1a86e7520764c76ad182dd83eb26cfcabf293ad666e2111906469",
    "out/back_sharded/model.data-00000-of-00001": "dfe07681bc1772f4eb85c7f9a5525c5c870121c3b043cde41bcf99ac912d4f64",
    "out/back_sharded/model.index": "2df66b271b1824aca2b1a368440a28f8aa968e3e1d12d10957bcca198905482c",
    "out/bf16/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/bf16/model.data-00000-of-00002": "a4493c613d07fe29358856bc6e2d03877c9c727fe449ce1b457e38db4fc9be78",
    "out/bf16/model.data-00001-of-00002": "14dfa4e332d56881b2db7e080f22f33b099de8fea134240ef8fb7014631999bc",
    "out/bf16/model.index": "7a675ff2318c9905b72e8f352c5ec0789b8960770d317c95c6f88847ec40c395",
    "out/fp16/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/fp16/model.data-00000-of-00001": "5ddca482e7e75a1a03270c2dde1e626b11b1eded27029c3f769b95a5fac70f55",
    "out/fp16/model.index": "f068d748ca2370e274bda10fb2ecb0a8dd6e73e15a04ea669b1399969c252321",
    "out/merged/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/merged/model.data-00000-of-00002": "705f4c23a7590b4043959c1088f189a5a380c132b4d79f2b3ab6be6c3649c6c6",
    "out/merged/model.data-00001-of-00002": "11c887ed88da43eda8458b30e16d44cbcc120869968f636361430fca79176c29",
    "out/merged/model.index": "0c670e637bd005d933a2243a4bc5d4e3b9daf0175bb11343f7b96bd905a99611",
    "out/npz/model.npz": "e852344141a63e55bb44c22a782d5f886a82a955f0daf989fe30d456776fce60",
    "out/packed/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/packed/model.data-00000-of-00002": "15aca7bc59ff31efa0efe6e1a8170002d4815c10824badf9b57eb08a02340905",
    "out/packed/model.data-00001-of-00002": "e462b9bb9e366c6fe4309a7d3cf72fe95d57c71203be97b99e67b183e6e3c008",
    "out/packed/model.index": "ec639c770e4bdc7f86873223e7be9961888b526e8af20abbd691811efe79e23c",
    "out/renamed/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/renamed/model.data-00000-of-00001": "ad76c355429f7c6272484510c87efd5b1c7e5c9f6f05b970a81dc0898dd7b539",
    "out/renamed/model.index": "88a4f9c36b7ba3faa9b9513c1807004766ca14986a0cc86c03757566713d8829",
    "out/selected/checkpoint": "011c96b970c1f56137037924fe1a0f0851369b0ee6692e120aea798615326f48",
    "out/selected/model.data-00000-of-00001": "d31c2ec5d4104e5f50512910b97836735c13ce51b6acd818c18cb92d7b66fc9c",
    "out/selected/model.index": "8819056bdb68c4ebd070b7594c7b61066782d5d330b85f50dbcaf52f9c759f22",
    "out/sharded/model-00001-of-00003.safetensors": "70781dba9366201fc77369114ff0d39f82e2f313849d2ae0644816b9f4c5bf2e",
    "out/sharded/model-00002-of-00003.safetensors": "89358028931bc73d8e3bfaff880659a48a4e2f9b0a2cd8978858b1425a076dd8",
    "out/sharded/model-00003-of-00003.safetensors": "44dd80aef27106c71da184e5694a5db92d127f94f13c6c8b4ca0a0d18b0a490b",
    "out/sharded/model.safetensors.index.json": "6d8ccdc5f6e34f75dd211fdbca8713de84303a7fe4650b9a485132f912624c1f",
    "out/st/model.safetensors": "3ca30c835efd3ca0edfe148bab4e8c9a5b3bac91e0d91b1286a2e5b1a7054637",
}


def test_every_command_writes_the_bytes_it_wrote_before(tmp_path):
    assert write_all(tmp_path) == PINNED
