"""docs/results.md section 4. Usage: python docs/scripts/critic_stats.py RUN_DIR [RUN_DIR ...]

Per run: how often the learned critic's first critique fixes a wrong first answer, leaks the
answer, or writes the verdict line; by step."""
import glob, json, re, sys
import pyarrow.parquet as pq
for run in sys.argv[1:]:
    tot = {"wrong": 0, "fixed": 0, "leak": 0, "fmt": 0, "crit": 0}
    for f in sorted(glob.glob(f"{run}/rollouts/step_*.parquet"), key=lambda p: int(re.findall(r"\d+", p)[-1])):
        s = {"wrong": 0, "fixed": 0, "leak": 0, "fmt": 0, "crit": 0}
        for r in pq.read_table(f).to_pylist():
            if not r.get("revised"):
                continue
            meta = json.loads(r["meta"]) if isinstance(r["meta"], str) else r["meta"]
            s["wrong"] += 1
            s["fixed"] += bool(r["correct_second"])
            nums = re.findall(r"-?\d+", r["critique"])
            s["leak"] += bool(nums) and int(nums[-1]) == int(meta["answer"])
            s["crit"] += len(r["critic_format_ok"]); s["fmt"] += sum(r["critic_format_ok"])
        for k in tot: tot[k] += s[k]
    print(f"{run}: wrong first answers {tot['wrong']}, fixed by revision {tot['fixed']} "
          f"({tot['fixed']/max(1,tot['wrong']):.2f}), critique ends with the right answer {tot['leak']} "
          f"({tot['leak']/max(1,tot['wrong']):.2f}), verdict line {tot['fmt']}/{tot['crit']}")
