{{/*
The plan for the given values, as YAML (use: include "megdet.plan" . | fromYaml).

Helm templates cannot call Python, so this mirrors megdet.plan.plan_run for the numbers the
chart needs (nodes, processes per node, global batch, LR, rescaled schedule). It is not a
second source of truth: tests/chart/test_notes_plan.py renders a matrix of values and asserts
that every number here equals plan_run's; the trainer re-plans from the real world size anyway.

Integer results use exact integer arithmetic: round_half_up(n / k) with k = batch / reference
is floor((2 * n * reference + batch) / (2 * batch)). Sprig has no sqrt, so the sqrt rule uses
Newton's iteration x <- (x + k / x) / 2 from x = max(1, k), which converges quadratically; 60
steps reach the float64 fixed point for any k this chart accepts (global batch <= 2^31).
*/}}
{{- define "megdet.plan" -}}
{{- $v := .Values -}}
{{- $gpus := int64 $v.gpus -}}
{{- $gpn := int64 $v.gpusPerNode -}}
{{- $nodes := div (add $gpus $gpn -1) $gpn -}}
{{- $procs := min $gpus $gpn -}}
{{- $batch := mul $gpus (int64 $v.imagesPerGpu) (int64 $v.accumulationSteps) -}}
{{- $ref := int64 $v.referenceBatch -}}
{{- $k := divf $batch $ref -}}
{{- $lr := float64 $v.baseLr -}}
{{- if eq $v.scaling "linear" -}}
{{- $lr = mulf $v.baseLr $k -}}
{{- else if eq $v.scaling "sqrt" -}}
{{- $x := maxf 1.0 $k -}}
{{- range until 60 -}}{{- $x = mulf 0.5 (addf $x (divf $k $x)) -}}{{- end -}}
{{- $lr = mulf $v.baseLr $x -}}
{{- end -}}
{{- $maxIter := div (add (mul 2 (int64 $v.maxIter) $ref) $batch) (mul 2 $batch) -}}
{{- $steps := list -}}
{{- range $v.steps -}}
{{- $steps = append $steps (div (add (mul 2 (int64 .) $ref) $batch) (mul 2 $batch)) -}}
{{- end -}}
{{- $warmup := div (add (mul 2 (int64 $v.warmupIters) $ref) $batch) (mul 2 $batch) -}}
nodes: {{ $nodes }}
workers: {{ sub $nodes 1 }}
procsPerNode: {{ $procs }}
worldSize: {{ $gpus }}
globalBatch: {{ $batch }}
scale: {{ $k }}
lr: {{ $lr }}
maxIter: {{ $maxIter }}
steps: {{ toJson $steps }}
warmupIters: {{ $warmup }}
{{- end -}}

{{/*
Cross-field rules that JSON Schema cannot express. values.schema.json has already checked
types, ranges and enums. Wording follows megdet.plan.SpecError, with the chart's value names.
*/}}
{{- define "megdet.validate" -}}
{{- $v := .Values -}}
{{- $gpus := int64 $v.gpus -}}
{{- $gpn := int64 $v.gpusPerNode -}}
{{- if and (gt $gpus $gpn) (ne (mod $gpus $gpn) 0) -}}
{{- fail (printf "gpus=%d is not a multiple of gpusPerNode=%d (multi-node runs use whole nodes)" $gpus $gpn) -}}
{{- end -}}
{{- $maxIter := int64 $v.maxIter -}}
{{- $prev := 0 -}}
{{- range $v.steps -}}
{{- if le (int64 .) (int64 $prev) -}}
{{- fail (printf "steps=%s must be strictly increasing" (toJson $v.steps)) -}}
{{- end -}}
{{- $prev = . -}}
{{- end -}}
{{- if and $v.steps (ge (int64 (last $v.steps)) $maxIter) -}}
{{- fail (printf "steps=%s must all be below maxIter=%d" (toJson $v.steps) $maxIter) -}}
{{- end -}}
{{- if ge (int64 $v.warmupIters) $maxIter -}}
{{- fail (printf "warmupIters=%d must be below maxIter=%d" (int64 $v.warmupIters) $maxIter) -}}
{{- end -}}
{{- $plan := include "megdet.plan" . | fromYaml -}}
{{- $batch := int64 $plan.globalBatch -}}
{{- if lt (int64 $plan.maxIter) 1 -}}
{{- fail (printf "maxIter=%d iterations at batch %d is less than one iteration at global batch %d" $maxIter (int64 $v.referenceBatch) $batch) -}}
{{- end -}}
{{- if eq $v.schedule "step" -}}
{{- $collapsed := false -}}
{{- $prev = 0 -}}
{{- range $plan.steps -}}
{{- if le (int64 .) (int64 $prev) -}}{{- $collapsed = true -}}{{- end -}}
{{- $prev = . -}}
{{- end -}}
{{- if and $plan.steps (ge (int64 (last $plan.steps)) (int64 $plan.maxIter)) -}}{{- $collapsed = true -}}{{- end -}}
{{- if $collapsed -}}
{{- fail (printf "steps=%s collapse to %s at global batch %d (maxIter %d); use a longer maxIter or a smaller batch" (toJson $v.steps) (toJson $plan.steps) $batch (int64 $plan.maxIter)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.nccl.ib.enabled (not $v.nccl.ib.rdmaResourceName) -}}
{{- fail "nccl.ib.enabled=true needs nccl.ib.rdmaResourceName: the extended resource your RDMA device plugin advertises (e.g. rdma/rdma_shared_device_a, rdma/hca_shared_devices_a, nvidia.com/hostdev)" -}}
{{- end -}}
{{- if ne (empty $v.dataset.valJson) (empty $v.dataset.valImages) -}}
{{- fail (printf "dataset.valJson=%q and dataset.valImages=%q: set both (evaluate) or neither (train only)" $v.dataset.valJson $v.dataset.valImages) -}}
{{- end -}}
{{- end -}}

{{/* The `megdet plan` flags for these values, so NOTES can show the equivalent command. */}}
{{- define "megdet.planFlags" -}}
{{- $v := .Values -}}
--gpus {{ $v.gpus | int64 }} --gpus-per-node {{ $v.gpusPerNode | int64 }} --images-per-gpu {{ $v.imagesPerGpu | int64 }} --accumulation-steps {{ $v.accumulationSteps | int64 }} --base-lr {{ $v.baseLr }} --reference-batch {{ $v.referenceBatch | int64 }} --max-iter {{ $v.maxIter | int64 }} --warmup-iters {{ $v.warmupIters | int64 }} --steps{{ range $v.steps }} {{ . | int64 }}{{ end }} --scaling {{ $v.scaling }} --schedule {{ $v.schedule }}
{{- end -}}
