"""The README's quick-start plugin: a task and a critic of your own, outside the package."""
import rltf_ray

@rltf_ray.register_task("unit_price")
class UnitPrice(rltf_ray.Task):
    meta_keys = ("answer",)
    default_params = {"max_price": 9}             # task.params it takes (an unknown key is an error)
    def make_problem(self, index, split):          # -> meta, the ground truth (or use a prompt file)
        count = 12 if split == "train" else 7      # "test": held-out problems training never sees
        price = index % self.params["max_price"] + 1
        return {"total": count * price, "count": count, "answer": price}
    def prompt_text(self, meta):
        return f"{meta['count']} pens cost {meta['total']} dollars. Price of one? <answer>n</answer>"
    def check(self, answer, meta):                 # the verifier
        return answer.strip() == str(meta["answer"])

@rltf_ray.register_critic("my_reviewer")
class MyReviewer:
    def __init__(self, task, strictness=1):       # critic_params from the config
        self.task, self.strictness = task, strictness
    async def judge(self, items):                  # items: [{"prompt", "response", "meta", ...}]
        out = []                                   # reward: the run's only for a task without a verifier
        for it in items:
            s = self.task.score(it["response"], it["meta"])
            out.append({"reward": s.reward, "correct": s.correct,
                        "critique": "Correct." if s.correct else "Divide the total by the count."})
        return out
