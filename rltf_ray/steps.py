"""One RL step, seen from the driver: the rollout graph as one Ray Data execution, the
hand-off to the learner, the step's metrics row; and held-out evaluation between steps."""
from __future__ import annotations

import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq

from rltf_ray import metrics as M
from rltf_ray.errors import ConfigError, DeadCriticError
from rltf_ray.graph import node_params, node_round
from rltf_ray.console import log
from rltf_ray.tracking import run_tag

STAGE_KINDS = ("generate", "critique", "revise", "reward")  # the nodes `rollout` runs as Ray Data stages


def no_held_out(task: str) -> ConfigError:
    """A run or a call that evaluates, on a task with no held-out problems of its own."""
    return ConfigError(f"eval.path: task '{task}' has no problem generator, so its held-out problems must "
                       "come from a file: set eval.path (the same row shape as the prompts), or evaluate "
                       "nothing (run.eval_before_after=false, run.eval_every=0)")


class StepRunner:
    """Mixed into the Pipeline with Services: uses its engines, broker and critic app."""

    def rollout(self, step: int) -> pa.Table:
        import ray

        from rltf_ray.stages import arrow_stage, concat_blocks
        from rltf_ray.stages.critique import make_critique, make_reward
        from rltf_ray.stages.rollout import make_generate, make_revise

        rows = self.source.rows_for_step(step)
        critic = self.critic_params  # every round calls the same critic app
        run = run_tag(self.out)  # the stages' gauges carry it, as the driver's do
        ds = ray.data.from_items(rows)
        remote_args = {"runtime_env": self.runtime_env} if self.runtime_env else {}
        for node in (n for n in self.order if n.kind in STAGE_KINDS):
            p = node_params(node)
            fn = {"generate": lambda: make_generate(self.engines, self.model_path, p, node.name,
                                                  self.cfg.engine.max_model_len),
                  "critique": lambda: make_critique(self.cfg.task, replace(p, app_name=critic.app_name),
                                                    self.cfg.run.turns, self.cfg.binac.critique_correct),
                  "revise": lambda: make_revise(self.engines, self.model_path,
                                              replace(p, template=p.template or self.task.revision_template), node.name,
                                              self.cfg.engine.max_model_len,
                                              self.cfg.binac.revisions_per_critique,
                                              self.cfg.binac.bilevel_lambda > 0),
                  "reward": lambda: make_reward(self.cfg.task, p, critic)}[node.kind]
            ds = ds.map_batches(arrow_stage(node.kind, node.name, fn(), node_round(node), run),
                                batch_size=p.batch_size, batch_format="pyarrow", num_cpus=0.1, **remote_args)
        table = concat_blocks(ray.get(list(ds.to_arrow_refs())))
        expected = len(rows) * node_params(self.cfg.node("generate")).n
        if table.num_rows != expected:
            raise RuntimeError(f"step {step}: {table.num_rows} rollout rows reached the trainer, "
                               f"expected {expected}; rows were lost in the pipeline")
        return table

    def launch(self, step: int) -> dict:
        """Generate a step's rollouts and hand them to the learner, which may still be training
        an earlier step (run.max_staleness)."""
        import ray

        from rltf_ray.stages.critique import check_critique_failures

        run = self.cfg.run
        t0 = time.perf_counter()
        table = self.rollout(step)
        t_roll = time.perf_counter() - t0
        pq.write_table(table, self.out / "rollouts" / f"step_{step}.parquet")
        rows = table.to_pylist()  # once: the failure check and the learner read the same rows
        check_critique_failures(rows, self.critic_params, run.rounds, step)
        ray.get(self.broker.put_step.remote(step, [ray.put(rows)]))
        return {"step": step, "table": table, "t0": t0, "seconds_rollout": t_roll}

    def evaluates_at(self, step: int) -> bool:
        every = self.cfg.run.eval_every
        return bool(every) and (step + 1) % every == 0

    def metrics_row(self, table: pa.Table, train: dict) -> dict:
        """A step's metrics row from its rollouts and the trainer's metrics of it."""
        learned = self.critic_params.critic == "learned"
        row = {**M.rollout_metrics(table, self.cfg.run, self.cfg.binac if learned else None), **train,
               "samples_seen": (train["step"] + 1) * table.num_rows, "bad_prompt_rows": len(self.source.bad_rows),
               "prompt_ids": list(dict.fromkeys(table.column("prompt_id").to_pylist()))}
        row["engine_version_lag"] = (row["policy_version"] - int(row.get("actor_trained", True))
                                     - row["policy_version_rollout"])  # 0: strictly on-policy
        warn = M.mismatch_warning({**row, "rollout_correction": self.cfg.loss.rollout_correction},
                                  self.cfg.loss.sampler_kl_warn, self.dtype,
                                  self.precision.learner)
        if warn and row["step"] >= getattr(self, "mismatch_warned_at", -1) * 2 + 1:
            self.mismatch_warned_at = row["step"]  # steps 1, 3, 7, 15, ...: visible, not a flood
            log(warn)
        if row.get("critic_format_waived_groups") and not getattr(self, "warned_format", False):
            self.warned_format = True  # once a run; the metric counts every step's
            log(f"WARNING step {row['step'] + 1}: in {row['critic_format_waived_groups']} group(s) no critique "
                "has the verdict line, so binac.format_penalty would give every critique the same reward; "
                "it is waived there (metric critic_format_waived_groups). Warm-start the critic "
                "(rltf-ray warmstart --critic) so that it writes the line.")
        return row

    def finish(self, launched: dict) -> dict:
        """Wait until the learner has trained a launched step; the step's metrics row, with a
        held-out evaluation every `run.eval_every`."""
        import ray

        run, step, table = self.cfg.run, launched["step"], launched["table"]
        row = {**self.metrics_row(table, self.wait_result(step)), "seconds_rollout": launched["seconds_rollout"],
               "seconds_step": time.perf_counter() - launched["t0"], "finished_at": time.time(),
               "engine_peak_rss_gb": max(ray.get([e.peak_rss_gb.remote() for e in self.engines])),
               "node_memory_peak_gb": self.node_memory.take()}  # since the last step's row
        self.check_critic_update(row)
        if self.evaluates_at(step):
            # the engines already hold the step's weights; at the last step this evaluation
            # is the "after" one, so it runs every measure and is not repeated
            final = step + 1 == run.steps and run.eval_before_after
            t1 = time.perf_counter()
            row["eval"] = self.evaluate(full=final or self.cfg.eval.during_training == "all")
            row["seconds_eval"] = time.perf_counter() - t1
            self.final_eval = row["eval"] if final else None
            log(f"eval after step {step + 1}: " + M.eval_line(row["eval"]))
        return row

    def check_critic_update(self, row: dict) -> None:
        """A learned critic's update with every advantage 0 gets a warning; `binac.max_dead_updates`
        of them in a row stop the run with the cause."""
        why = M.dead_critic_update(row)
        if not row.get("critic_trained"):
            return
        self.dead_updates = getattr(self, "dead_updates", 0) + 1 if why else 0
        if not why:
            return
        limit = self.cfg.binac.max_dead_updates
        log(f"WARNING step {row['step'] + 1}: the critic's update trained on nothing "
            f"({self.dead_updates} of binac.max_dead_updates={limit} in a row): {why}")
        if self.dead_updates >= limit:
            raise DeadCriticError(f"step {row['step'] + 1}: {self.dead_updates} critic updates in a row had every "
                                  f"advantage 0, so the learned critic is not training. Cause: {why}")

    # -- held-out evaluation -------------------------------------------------------------
    def evaluator(self):
        from rltf_ray.evaluation import Evaluator
        from rltf_ray.stages.critique import ask_critic, score_texts

        critic = self.critic_params
        gen = node_params(self.cfg.node("generate"))

        # the engine's ids of each answer and the policy version go with the texts: reward
        # functions get them as completion_ids and trainer_state.global_step
        def score(rows: list[dict], answers: list, version: int) -> list[tuple]:
            got = score_texts(self.task, critic, rows, [a.text for a in answers], list(range(len(rows))),
                              [a.token_ids for a in answers], version)
            return [got[i][0] for i in range(len(rows))]

        def critique(rows: list[dict], answers: list, which: list[int], version: int) -> dict:
            # only wrong answers are critiqued (the evaluator's oracle), as in training, where a
            # verdict-aware learned critic is told the verifier's verdict
            told = [{**r, "correct_first": False} for r in rows]
            # in chunks of the critique stage's batch_size, as a training step sends them, so
            # that `timeout_s` bounds the same amount of critic work in both: on a slow engine
            # a whole held-out set in one request outlasts it, and every retry queues behind
            # the abandoned work
            got: dict = {}
            texts, ids = [a.text for a in answers], [a.token_ids for a in answers]
            for at in range(0, len(which), critic.batch_size):
                # one critique each: the evaluation uses one, and K would cost K times the critic's time
                got.update(ask_critic(critic, told, texts, which[at:at + critic.batch_size], samples=1,
                                      ids=ids, step=version, temperature=self.cfg.eval.critic_temperature))
            return {i: (res["critique"] if res else None, err) for i, (res, err) in got.items()}

        E = self.cfg.eval
        return Evaluator(self.engines, self.model_path, self.task, score, critique,
                         gen.temperature if E.temperature is None else E.temperature, gen.max_tokens,
                         node_params(self.cfg.node("revise")).template or self.task.revision_template,
                         E.critique_max_tokens,
                         critic.max_failed_fraction)

    def evaluate(self, full: bool = True) -> dict:
        """Held-out evaluation with every measure `eval` asks for (`full`), or only the
        greedy first-turn accuracy (the cheap in-training curve). The problems are the
        task's test split, or the rows of `eval.path`."""
        E = self.cfg.eval
        rows = self.held_out
        if rows is None:
            raise no_held_out(self.task.name)
        out = self.evaluator().run(rows, E.pass_k if full else [], E.samples,
                                   E.feedback_rounds if full else 0, E.self_feedback_rounds if full else 0,
                                   greedy=E.greedy or not full)
        if E.split == "calibration":  # a setting chosen on these is then scored on the test split
            return {**out, "split": "calibration", "requested": E.calibration_prompts,
                    "held_out": E.calibration_path or "task"}
        return {**out, "requested": E.prompts, "held_out": E.path or "task"}
