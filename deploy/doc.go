// Package deploy holds example manifests and scripts for running a gorun
// program under a scheduler: kubernetes/ (Kubeflow PyTorchJob, Trainer v2
// TrainJob, MPIJob, an Indexed Job, a JobSet) and slurm/ (an sbatch script
// that runs gorun, and srun alone). It has no Go code: its tests check the
// files. What each pod's environment resolves to is tested in package
// collective (TestKubeManifests), which reads the same files.
package deploy
