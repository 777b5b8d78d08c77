"""The ``step`` profile: add ``--step-users`` users every ``--step-seconds`` up to ``-u``, then hold until ``-t``.

Each step is a plateau long enough for latency to settle, so the history plot shows where p99 starts to climb.
"""

from locust import LoadTestShape


class StepShape(LoadTestShape):
    use_common_options = True  # reads -u (peak users) and -t (run time) itself

    def tick(self):
        options = self.runner.environment.parsed_options
        elapsed = self.get_run_time()
        if options.run_time and elapsed >= options.run_time:
            return None
        step = int(elapsed // options.step_seconds) + 1
        users = min(options.num_users or options.step_users, step * options.step_users)
        # Spawn a whole step at once: the plateau, not the ramp, is what is measured.
        return users, max(1.0, float(options.step_users) * 10)
