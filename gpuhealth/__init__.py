"""gpu-health's library for users' own code; `gpuhealth.training` watches a training job's GPUs."""
