"""core/awake.py: the ticker runs while anything holds the loop awake, and stops after."""

import asyncio

from speedsplit.core.awake import Awake, held


def test_the_ticker_runs_while_held_and_stops_with_the_last_holder():
    async def main():
        awake = Awake(period_s=0.001)
        async with awake:
            first = awake._task
            async with awake:  # a second request in flight shares the one ticker
                assert awake._task is first and awake.holders == 2
            assert not first.done() and awake.holders == 1
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        assert first.cancelled() and awake._task is None and awake.holders == 0
        async with held() as again:
            assert again._task is not None and not again._task.done()

    asyncio.run(main())
