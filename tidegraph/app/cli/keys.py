"""``tidegraph rotate-key``: a new data key for a group's sealed episodes (docs/streaming.md
"Sealed episodes"). The records produced from then on are sealed with it; the older keys stay,
so what they sealed still opens, until the group is purged (``forget --all --purge``).

    tidegraph rotate-key --group G [--json] [--data-dir DIR]

Importing this module registers ``rotate-key`` on ``tidegraph.app.cli.main.app``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidegraph.app.cli.main import (
    app,
    console,
    data_dir_option,
    get_settings,
    group_option,
    json_line,
    json_option,
    use_data_dir,
)


@app.command("rotate-key")
def rotate_key_command(
    group: str = group_option(),
    as_json: bool = json_option(),
    data_dir: Path | None = data_dir_option(),
) -> None:
    """Give the group a new data key for its sealed episodes (TIDEGRAPH_ENCRYPT_EPISODES):
    new records are sealed with it, older ones still open with theirs."""
    use_data_dir(data_dir)
    key_id, keys = asyncio.run(_rotate(group))
    if as_json:
        json_line({"group_id": group, "key_id": key_id, "keys": keys})
    else:
        console.print(
            f"group {group}: new data key {key_id} ({keys} kept; the older ones open the "
            "records they sealed until the group is purged)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


async def _rotate(group: str) -> tuple[str, int]:
    from tidegraph.app.memory import open_reader
    from tidegraph.stores.keys import rotate_key

    reader = await open_reader(get_settings())
    try:
        keys = reader.store.keys
        key = await rotate_key(keys, group)
        return key.key_id, len(await keys.group_keys(group))
    finally:
        await reader.close()
