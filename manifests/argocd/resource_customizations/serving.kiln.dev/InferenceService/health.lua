-- Argo CD health of a Kiln InferenceService (serving.kiln.dev/v1alpha1), from the status the
-- operator writes: conditions Stalled, Ready, SpecValid, Progressing (each with
-- observedGeneration), status.observedGeneration (0, the CRD's default, until the operator's first
-- write), readyReplicas, status.warmup (the warm-up gate) and status.autoscaling.activeWindow (a
-- pre-warm window's replica floor).
--   Degraded    Stalled is True for the current generation (an invalid spec, a refused child, a
--               stalled rollout, a failed warm-up, a passed progress deadline), or, from an
--               operator that wrote no Stalled, the spec is invalid (InvalidSpec), a pod failed
--               its warm-up, or ProgressDeadlineExceeded: none of these resolves by waiting.
--   Progressing the operator has not yet judged the current generation, a rollout is under way,
--               a canary is under way (Reconciling CanaryProgressing or CanaryPromoting: the
--               stable version is Ready meanwhile), or fewer pods are warm and ready than the
--               floor (minReplicas, or an open pre-warm window's floor). A rolled-back canary is
--               Stalled (CanaryRolledBack), so Degraded until the spec changes.
--   Healthy     Ready is True for the current generation and the floor's pods are ready;
--               a service at minReplicas 0 is Healthy asleep (ScaledToZero) and while it wakes
--               (Waking: Kiln's activator holds its requests), unless a pre-warm window's
--               floor is not warm yet.
-- Written for Argo CD's default sandbox (no string library), so it runs as an argocd-cm override.
local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function explain(c)
  local reason = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then
    return reason .. ": " .. c.message
  end
  return reason
end

local generation = obj.metadata.generation or 0
local status = obj.status
if status == nil or status.observedGeneration == nil or status.observedGeneration == 0 then
  hs.status = "Progressing"
  hs.message = "Waiting for the Kiln operator to observe the InferenceService"
  return hs
end
if status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Kiln operator to observe generation " .. generation
  return hs
end

local conditions = status.conditions or {}
local stalled = condition(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" and stalled.observedGeneration == generation then
  hs.status = "Degraded"
  hs.message = explain(stalled)
  return hs
end
local specValid = condition(conditions, "SpecValid")
if specValid ~= nil and specValid.status == "False" then
  hs.status = "Degraded"
  hs.message = explain(specValid)
  return hs
end

local ready = condition(conditions, "Ready")
local progressing = condition(conditions, "Progressing")
if progressing ~= nil and progressing.status == "False" and progressing.reason == "ProgressDeadlineExceeded" then
  hs.status = "Degraded"
  hs.message = explain(progressing)
  return hs
end
if ready ~= nil and ready.reason == "ProgressDeadlineExceeded" then
  hs.status = "Degraded"
  hs.message = explain(ready)
  return hs
end

local warmup = status.warmup or {}
if (warmup.failedReplicas or 0) > 0 then
  hs.status = "Degraded"
  hs.message = "WarmupFailed: " .. warmup.failedReplicas .. " pod(s) failed the warm-up gate"
  if warmup.failureMessage ~= nil and warmup.failureMessage ~= "" then
    hs.message = hs.message .. ": " .. warmup.failureMessage
  end
  return hs
end

if ready == nil or ready.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Kiln operator to judge Ready for generation " .. generation
  return hs
end
if ready.status ~= "True" then
  hs.status = "Progressing"
  hs.message = explain(ready)
  return hs
end

local reconciling = condition(conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" and reconciling.observedGeneration == generation
    and (reconciling.reason == "CanaryProgressing" or reconciling.reason == "CanaryPromoting") then
  hs.status = "Progressing"
  hs.message = explain(reconciling)
  return hs
end

local floor = 1
local floorCause = "minReplicas"
if obj.spec ~= nil and obj.spec.autoscaling ~= nil and obj.spec.autoscaling.minReplicas ~= nil then
  floor = obj.spec.autoscaling.minReplicas
end
if ready.reason == "ScaledToZero" or ready.reason == "Waking" then
  -- minReplicas 0 (in the spec or from a profile): asleep, or woken with the requests held
  floor = 0
end
local window = (status.autoscaling or {}).activeWindow
if window ~= nil and window.floorReplicas ~= nil and window.floorReplicas > floor then
  floor = window.floorReplicas
  floorCause = "pre-warm window " .. (window.name or "")
end
local readyReplicas = status.readyReplicas or 0
if readyReplicas < floor then
  hs.status = "Progressing"
  hs.message = "Warming up: " .. readyReplicas .. " of " .. floor .. " pods ready (floor: " .. floorCause .. ")"
  return hs
end

hs.status = "Healthy"
hs.message = explain(ready)
return hs
