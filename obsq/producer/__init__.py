"""Putting tasks in: the Client and SyncClient (enqueue, publish, flows, results), the
producer hooks around each write, where each task goes, and what an enqueue answers."""
