-- Every (trajectory, batch) consumption of a run into `consumptions`, from the assembly materialised by
-- streams.replay (the audit's `consumed`: the first batch_consumed event of each pair), as streams.derive
-- writes them.
INSERT INTO consumptions (run_id, trajectory_id, batch_id, trainer_version, consumed_at)
SELECT {run:String}, trajectory_id, batch_id, trainer_version, fromUnixTimestamp64Micro(consumed_us, 'UTC')
FROM consumed
