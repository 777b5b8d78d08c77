"""The ``spike`` profile: ``--spike-base-users`` users, a sudden jump to ``-u`` users for ``--step-seconds``, back down.

Phases: base for one ``--step-seconds``, spike for one, then base until ``-t``. The history plot shows how far p99
rises during the spike (queueing, 503s once the job queue is full) and how quickly it recovers after it.
"""

from locust import LoadTestShape


class SpikeShape(LoadTestShape):
    use_common_options = True  # reads -u (spike users) and -t (run time) itself

    def tick(self):
        options = self.runner.environment.parsed_options
        elapsed = self.get_run_time()
        if options.run_time and elapsed >= options.run_time:
            return None
        base = max(1, options.spike_base_users)
        in_spike = options.step_seconds <= elapsed < 2 * options.step_seconds
        users = max(base, options.num_users or base) if in_spike else base
        return users, 1000.0  # all at once: a spike, not a ramp
